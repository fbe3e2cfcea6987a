"""``exp`` and ``logsumexp`` through ``exp2``.

Where this was measured, torch's ``exp`` is much slower than ``exp2``: on a 2-core AMD EPYC (torch 2.13, MKL), ``exp_`` of a 591k-element fp32 attention-score block with masked (-inf) entries
takes 1.33 ms and ``exp2_`` of the same block scaled by log2(e) 0.11 ms (12x); on a [64 x 49152] logits chunk
``logsumexp`` takes 1.82 ms and :func:`logsumexp` here 0.59 ms. The extra rounding of ``x * log2(e)`` is a
relative error of about ``|x| * 6e-8`` in the result: ~3e-6 at the log-probabilities of -50 that matter least.
"""
from __future__ import annotations

import torch

LOG2E = 1.4426950408889634


def exp_(x: torch.Tensor) -> torch.Tensor:
    """``x.exp_()``: in place, returns ``x``."""
    return x.mul_(LOG2E).exp2_()


def exp(x: torch.Tensor) -> torch.Tensor:
    """``torch.exp(x)`` into a new tensor."""
    return torch.mul(x, LOG2E).exp2_()


def logsumexp(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """``torch.logsumexp(x, dim, keepdim)`` (rows of -inf give -inf, a +inf gives +inf, as torch's do)."""
    m = x.amax(dim, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    out = exp_(x - m).sum(dim, keepdim=True).log_().add_(m)
    return out if keepdim else out.squeeze(dim)

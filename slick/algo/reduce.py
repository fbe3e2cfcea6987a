"""Reducing a per-token loss [B, T] to a scalar, micro-batch aware.

Two modes:

* sample mode (default): mean over samples of each sample's mean over its
  masked tokens. A sample with no masked token contributes 0 but still counts
  in the number of samples.
* token mode (``per_token_loss=True``, ``--calculate-per-token-loss``): sum over
  all masked tokens divided by the number of masked tokens.

The optional normalisers make gradient accumulation exact: split a global
batch into micro-batches, pass the *global* ``num_samples`` (sample mode) or
``num_tokens`` (token mode) to every call, and the micro-batch results sum to
the global result.
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from .utils import masked_sum


def reduce(
    per_token: Tensor,
    mask: Tensor,
    per_token_loss: bool,
    num_samples: Optional[float] = None,
    num_tokens: Optional[float] = None,
) -> Tensor:
    """Scalar reduction of ``per_token`` [B, T] over ``mask`` [B, T] (see module doc)."""
    if per_token.shape != mask.shape:
        raise ValueError(f"per-token values {tuple(per_token.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.to(per_token.dtype)
    if per_token_loss:
        denom = mask.sum() if num_tokens is None else num_tokens
        if num_tokens is not None and num_tokens <= 0:
            raise ValueError(f"num_tokens must be > 0, got {num_tokens}")
        return masked_sum(per_token, mask) / (denom.clamp(min=1.0) if num_tokens is None else denom)
    per_sample = masked_sum(per_token, mask, dim=-1) / mask.sum(dim=-1).clamp(min=1.0)
    if num_samples is None:
        num_samples = per_token.shape[0]
    if num_samples <= 0:
        raise ValueError(f"num_samples must be > 0, got {num_samples}")
    return per_sample.sum() / num_samples

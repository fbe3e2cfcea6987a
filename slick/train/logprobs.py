"""Token logprobs and entropy from hidden states, in chunks, so [tokens, vocab] fp32 logits never exist at once.

``logprob[t] = log softmax(logits[t] / temperature)[target[t]]`` and
``entropy[t] = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v`` with ``z = logits / temperature``,
computed in fp32 whatever the matmul dtype. When gradients are needed and there is more than one chunk,
each chunk runs under activation checkpointing: its logits are recomputed in backward instead of kept.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = True, entropy_grad: bool = True,
                         softcap: Optional[float] = None):
    """Logprob of ``targets`` and entropy (or None) for logits ``[n, V]``; both fp32 ``[n]``."""
    z = logits.float()
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        if entropy_grad:
            ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        else:
            with torch.no_grad():
                ent = lse.detach() - (torch.softmax(z.detach(), dim=-1) * z.detach()).sum(-1)
    return lp, ent


def _chunk(hidden, weight, bias, targets, temperature, with_entropy, entropy_grad, softcap):
    logits = F.linear(hidden, weight, bias)
    lp, ent = logprobs_from_logits(logits, targets, temperature, with_entropy, entropy_grad, softcap)
    return lp, (ent if ent is not None else lp.new_zeros(0))


def chunked_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor,
                     temperature: float = 1.0, chunk_size: int = 512, with_entropy: bool = True,
                     entropy_grad: bool = True, softcap: Optional[float] = None):
    """Logprobs ``[n]`` and entropy ``[n]`` (or None) of ``targets`` given hidden states ``[n, H]``.

    ``lm_head`` is the model's output projection (``model.get_output_embeddings()``); only these ``n``
    rows go through it, ``chunk_size`` rows at a time.
    """
    if chunk_size <= 0:
        raise ValueError(f"logprob_chunk_size must be positive (got {chunk_size})")
    n = hidden.shape[0]
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    use_ckpt = torch.is_grad_enabled() and n > chunk_size
    lps, ents = [], []
    for start in range(0, n, chunk_size):
        args = (hidden[start:start + chunk_size], weight, bias, targets[start:start + chunk_size],
                temperature, with_entropy, entropy_grad, softcap)
        if use_ckpt:
            lp, ent = checkpoint(_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _chunk(*args)
        lps.append(lp)
        ents.append(ent)
    lp = torch.cat(lps) if lps else hidden.new_zeros(0, dtype=torch.float32)
    if not with_entropy:
        return lp, None
    return lp, (torch.cat(ents) if ents else hidden.new_zeros(0, dtype=torch.float32))

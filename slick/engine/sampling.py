"""Batched next-token sampling with per-request settings and per-request random streams.

Each row has its own temperature (0 = greedy), top-p and top-k and one uniform number ``u`` in (0, 1]
drawn from that request's own random stream; the token is found by inverse-CDF search over the
(optionally truncated) distribution. Because a row's token depends only on its logits and its own ``u``,
a seeded request reproduces the same tokens whatever else is in the batch.

The returned logprob is ``log_softmax(logits / T)`` of the chosen token in fp32, *before* top-p/top-k
truncation (``T = 1`` for greedy rows) -- the quantity the trainer recomputes.
"""
from __future__ import annotations

from typing import Sequence

import torch


def sample(logits: torch.Tensor, temperature: Sequence[float], top_p: Sequence[float],
           top_k: Sequence[int], uniforms: Sequence[float]) -> tuple[list[int], list[float]]:
    """Pick one token per row of fp32 ``logits`` [B,V]; return (token ids, logprobs) as Python lists."""
    B, V = logits.shape
    dev = logits.device
    greedy = [t <= 0 for t in temperature]
    temps = torch.tensor([1.0 if g else float(t) for g, t in zip(greedy, temperature)],
                         dtype=torch.float32, device=dev)
    logp = torch.log_softmax(logits / temps.view(B, 1), dim=-1)
    if all(greedy):
        tok = logits.argmax(dim=-1)
    else:
        rows = [i for i, g in enumerate(greedy) if not g]
        idx = torch.tensor(rows, device=dev)
        lp = logp.index_select(0, idx) if len(rows) < B else logp
        u = torch.tensor([uniforms[i] for i in rows], dtype=torch.float32, device=dev).view(-1, 1)
        ks = [int(top_k[i]) if 0 < int(top_k[i]) < V else V for i in rows]
        ps = [float(top_p[i]) for i in rows]
        if all(k == V for k in ks) and all(p >= 1.0 for p in ps):
            cdf = lp.exp().cumsum(dim=-1)
            pick = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=V - 1).view(-1)
        else:
            pick = _sample_truncated(lp, u, ks, ps)
        if len(rows) == B:
            tok = pick
        else:
            tok = logits.argmax(dim=-1)
            tok[idx] = pick
    chosen = logp.gather(1, tok.view(B, 1)).view(B)
    return tok.tolist(), chosen.tolist()


def _sample_truncated(lp: torch.Tensor, u: torch.Tensor, ks: list[int], ps: list[float]) -> torch.Tensor:
    """Inverse-CDF sampling restricted to each row's top-k and top-p nucleus (sorted space)."""
    n, V = lp.shape
    dev = lp.device
    kmax = max(ks)
    if kmax < V:  # only the top kmax entries can survive: topk is much cheaper than a full sort
        probs, order = torch.topk(lp.exp(), kmax, dim=-1)
    else:
        probs, order = torch.sort(lp.exp(), dim=-1, descending=True)
    width = probs.shape[1]
    rank = torch.arange(width, device=dev).view(1, -1)
    keep = rank < torch.tensor(ks, device=dev).view(-1, 1)
    before = probs.cumsum(dim=-1) - probs            # mass strictly before each entry
    keep &= before < torch.tensor(ps, dtype=torch.float32, device=dev).view(-1, 1)
    keep[:, 0] = True                                 # the most likely token always survives
    probs = probs * keep
    cdf = probs.cumsum(dim=-1)
    j = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_(max=width - 1)
    return order.gather(1, j).view(-1)

"""Prompt logprobs: the engine's next-token logprobs at every position of a given token sequence.

What SGLang returns for ``return_logprob`` with ``logprob_start_len`` (``input_token_logprobs``,
``input_top_logprobs``) and vLLM for ``prompt_logprobs``: for each position ``i`` of ``ids[:-1]``, the logprob
(``log_softmax`` of the logits at temperature 1, fp32) of the token that follows, ``ids[i + 1]``, and the ``k``
most likely next tokens. A teacher scores a student's sampled tokens with it (on-policy distillation) and the
mismatch probe compares it with the trainer's distribution.

One causal forward of the whole sequence over the engine's own weights and kernels, without the KV cache (the
running requests' slots are untouched); the vocabulary projection runs ``CHUNK`` positions at a time, so a long
sequence never holds ``len x vocab`` logits at once.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

CHUNK = 256      # positions per vocabulary projection


@torch.inference_mode()
def hidden_states(model, ids: torch.Tensor) -> torch.Tensor:
    """The last decoder layer's output ``[n, H]`` for one sequence ``ids`` ``[n]`` at positions ``0..n-1``
    (``model``: a :class:`slick.engine.model.Transformer`; the same pieces as its prefill, no cache)."""
    model._check_loaded()
    c = model.cfg
    n = ids.shape[0]
    model._ensure_rope(n)
    cos = model.cos[:n].view(1, n, 1, -1)
    sin = model.sin_signed[:n].view(1, n, 1, -1)
    x = F.embedding(ids.view(1, n), model.embed)
    for L in model.layers:
        q, k, v = model._qkv(L, x, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.num_heads != c.num_kv_heads)
        x = model._mlp_out(L, x, a.transpose(1, 2).reshape(1, n, -1))
    return x[0]


@torch.inference_mode()
def prompt_logprobs(model, ids: Sequence[int], k: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """``(token_logprobs, top)`` for positions ``0..n-2`` of ``ids``: ``token_logprobs[i]`` is the logprob of
    ``ids[i + 1]`` after ``ids[:i + 1]``, ``top[i]`` the ``k`` most likely next tokens there as ``(id, logprob)``,
    most likely first (empty lists when ``k`` is 0)."""
    seq = torch.tensor(list(ids), dtype=torch.long, device=model.device)
    h = hidden_states(model, seq[:-1]) if len(seq) > 1 else None
    token_lps: list[float] = []
    top: list[list[tuple[int, float]]] = []
    for a in range(0, len(seq) - 1, CHUNK):
        logp = torch.log_softmax(model._logits(h[a:a + CHUNK]).float(), dim=-1)
        nxt = seq[a + 1:a + 1 + logp.shape[0]]
        token_lps += logp.gather(1, nxt.view(-1, 1)).view(-1).tolist()
        if k > 0:
            vals, idx = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
            top += [list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())]
        else:
            top += [[] for _ in range(logp.shape[0])]
    return token_lps, top


def as_dicts(ids: Sequence[int], token_lps: Sequence[float], top: Sequence) -> list[dict]:
    """``[{token: logprob}]`` per position 0..n-2: the top candidates plus the token that follows (vLLM's
    ``prompt_logprobs`` shape, the contract of ``prompt_top_logprobs``)."""
    out = []
    for i, (lp, cands) in enumerate(zip(token_lps, top)):
        d = {int(t): float(v) for t, v in cands}
        d[int(ids[i + 1])] = float(lp)
        out.append(d)
    return out

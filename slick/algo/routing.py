"""Mixture-of-experts routing maths shared by the engine and the trainer: pure functions on tensors.

* :func:`route`: a router's top-k choice and gate weights from its logits (softmax over all experts in fp32, then
  top-k; ``normalize`` rescales the k weights to sum to 1, as Mixtral always does and Qwen3-MoE does when its
  config's ``norm_topk_prob`` is true).
* :func:`replay_weights`: the gate weights of *given* experts (routing replay): the same softmax of the router's
  own logits, read at the replayed ids instead of the top-k, normalised the same way; the gradient reaches the
  router through these weights.
* :func:`expert_mix`: the SwiGLU experts' weighted sum, tokens grouped per expert (one gather, two matmuls and one
  scatter-add per expert that has tokens; no loop over tokens).
* :func:`routing_stats`: per-layer expert load (max/mean), router entropy and the fraction of tokens whose own
  top-k differs from a replayed one.
"""
from __future__ import annotations

import base64
from typing import Optional

import torch
import torch.nn.functional as F


def route(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [N,k] fp32, ids [N,k] int64)`` of the top-k experts of router ``logits`` [N,E]."""
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, k, dim=-1)
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids


def replay_weights(logits: torch.Tensor, ids: torch.Tensor, normalize: bool) -> torch.Tensor:
    """Gate weights [N,k] (fp32) of the experts ``ids`` [N,k] under router ``logits`` [N,E] (routing replay)."""
    probs = torch.softmax(logits.float(), dim=-1)
    w = probs.gather(1, ids.long())
    if normalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w


def expert_mix(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
               down: torch.Tensor) -> torch.Tensor:
    """``sum_j weights[:, j] * down_e(silu(gate_e(x)) * up_e(x))`` over each token's experts ``e = ids[:, j]``.

    ``x`` [N,H]; ``ids``/``weights`` [N,k]; ``gate_up`` [E, 2I, H] (gate rows first) and ``down`` [E, H, I], HF's
    layouts. Tokens are grouped per expert with one stable sort; each expert's rows are gathered (index_select),
    run through its SwiGLU and scaled by their gate weight, then added into the output (index_add), in expert order.
    The result has ``x``'s dtype; products with the fp32 gate weights are rounded once, as HF's experts do.
    """
    N, k = ids.shape
    E = gate_up.shape[0]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E).tolist()
    wflat = weights.reshape(-1)
    out = torch.zeros_like(x)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        sel = order[start:start + n]
        start += n
        tok = sel // k
        g, u = F.linear(x.index_select(0, tok), gate_up[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(g) * u, down[e]) * wflat.index_select(0, sel).unsqueeze(1)
        out = out.index_add(0, tok, y.to(out.dtype))
    return out


def routing_stats(logits: torch.Tensor, ids: torch.Tensor, num_experts: int,
                  replayed: Optional[torch.Tensor] = None) -> dict[str, float]:
    """One layer's routing statistics over ``N`` tokens: ``load_max`` / ``load_mean`` (tokens per expert, the
    busiest and the average), ``entropy`` (mean router entropy, nats) and, with ``replayed`` ids [N,k],
    ``mismatch`` (fraction of tokens whose own top-k set ``ids`` differs from the replayed set)."""
    with torch.no_grad():
        load = torch.bincount(ids.reshape(-1).long(), minlength=num_experts).float()
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = {"load_max": float(load.max()), "load_mean": float(load.mean()),
               "entropy": float(-(logp.exp() * logp).sum(-1).mean()) if logits.shape[0] else 0.0}
        if replayed is not None:
            a = torch.sort(ids.long(), dim=-1).values
            b = torch.sort(replayed.long(), dim=-1).values
            out["mismatch"] = float((a != b).any(-1).float().mean()) if a.shape[0] else 0.0
    return out


def encode_routing(ids: torch.Tensor) -> dict:
    """Recorded expert ids ``[tokens, layers, k]`` as a JSON-able dict (uint8 bytes, base64), as
    ``Sample.routed_experts`` holds them."""
    t = ids.to(torch.uint8).contiguous().cpu()
    return {"shape": list(t.shape), "uint8_b64": base64.b64encode(t.numpy().tobytes()).decode("ascii")}


def decode_routing(d: Optional[dict]) -> Optional[torch.Tensor]:
    """The uint8 tensor of an :func:`encode_routing` dict (None for None); a ValueError naming what is wrong."""
    if d is None:
        return None
    try:
        shape, raw = [int(v) for v in d["shape"]], base64.b64decode(d["uint8_b64"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"routed_experts: not a {{'shape', 'uint8_b64'}} record ({e})") from e
    n = 1
    for v in shape:
        n *= v
    if len(shape) != 3 or len(raw) != n:
        raise ValueError(f"routed_experts: shape {shape} does not match its {len(raw)} bytes")
    if not n:
        return torch.zeros(shape, dtype=torch.uint8)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(*shape)

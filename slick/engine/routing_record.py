"""Which experts a request's tokens went through, for routing replay (``--use-routing-replay``; docs/moe.md).

An MoE model's forward leaves its routing in ``model.recorder`` (``slick.engine.moe``); the continuous-batching
scheduler hands each request its rows: the prompt's positions from its prefill (with a shared prefix's rows in
front, or a donor request's prompt rows when its KV was copied) and one row per decode step. A finished
request's :func:`routed_experts` covers positions ``0 .. len(prompt) + len(out) - 2``: every token that was an
input to the model (the last sampled token never is), ``[tokens, MoE layers, k]`` uint8, encoded for the sample.
Dense models have no recorder and every function here is a no-op.
"""
from __future__ import annotations

from typing import Optional

import torch

from slick.algo.routing import encode_routing


def prefill_rows(model, chunk: list, start: int) -> Optional[list[torch.Tensor]]:
    """After ``model.prefill`` of ``chunk`` (``(prompt, slots)`` items from position ``start``): each item's
    ``[len(prompt) - start, layers, k]`` routing (None for a dense model)."""
    if model.recorder is None:
        return None
    ids = model.recorder.take()
    P = max(len(p) for p, _ in chunk) - start
    ids = ids.view(len(chunk), P, *ids.shape[1:])
    return [ids[row, :len(p) - start] for row, (p, _) in enumerate(chunk)]


def decode_rows(model, running: list) -> None:
    """After ``model.decode`` of the running requests: append each its row (padding rows dropped)."""
    if model.recorder is None:
        return
    ids = model.recorder.take()
    for i, r in enumerate(running):
        r.routing.append(ids[i:i + 1])


def routed_experts(r) -> Optional[dict]:
    """The finished request's routing, encoded (``slick.algo.routing.encode_routing``), or None."""
    if not r.routing:
        return None
    ids = torch.cat(r.routing)[:len(r.prompt) + len(r.out) - 1]
    return encode_routing(ids)

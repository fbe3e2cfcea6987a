"""Weights cast to the matmul dtype, and the lm head's cast kept for a whole optimizer step.

Inside :func:`cached_weight_casts` (entered by the trainer around its micro-batch loop, one thread) a weight
cast by :func:`cast` (the lm head's, used by every logits chunk forward and backward) is computed on first use
and reused by every later use in the block. The weights must not change inside. Outside the block every call
casts afresh. :func:`cast_cat` concatenates a group of weights (one qkv or gate/up matrix) and casts it; the
fused decoder layers call it with ``cache=False`` at every use: a layer's cast is then freed as soon as the
layer is done (keeping all layers' casts for the step held 0.27 GB more at the step's peak for SmolLM2-135M,
and was no faster: a fresh cast of one layer's weights reuses memory that is already mapped).
The casts are values, not autograd nodes: the fused nodes that use them (``slick.train.logprobs``,
``slick.train.fused_layers``) return their weight gradients in the weights' own dtype.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Optional, Sequence

import torch

_local = threading.local()


@contextlib.contextmanager
def cached_weight_casts():
    """Reuse casts inside this block (nested blocks share the outermost one's cache)."""
    outer = getattr(_local, "casts", None)
    if outer is None:
        _local.casts = {}
    try:
        yield
    finally:
        if outer is None:
            _local.casts = None


def cast(t: Optional[torch.Tensor], dt: torch.dtype) -> Optional[torch.Tensor]:
    """``t`` in ``dt`` (``t`` itself when it already is; None stays None)."""
    if t is None or t.dtype == dt:
        return t
    return cast_cat([t], dt)


def cast_cat(ts: Sequence[torch.Tensor], dt: torch.dtype, cache: bool = True) -> torch.Tensor:
    """``torch.cat(ts)`` (rows) in ``dt``; ``ts[0]`` in ``dt`` when it is alone. ``cache=False``: never cached
    (also right for weights whose storage is swapped between calls, as FSDP's unsharded parameters are)."""
    casts = getattr(_local, "casts", None) if cache else None
    key = (tuple(id(t) for t in ts), dt)
    hit = casts.get(key) if casts is not None else None
    if hit is not None and all(a is b for a, b in zip(hit[0], ts)):
        return hit[1]
    out = ts[0].to(dt) if len(ts) == 1 else torch.cat([t.to(dt) for t in ts])
    if casts is not None:
        casts[key] = (tuple(ts), out)
    return out

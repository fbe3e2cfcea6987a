"""What a broadcast weight update may make the engine allocate, checked before any buffer exists.

A caller of ``/update_weights_from_distributed`` announces ``names``, ``dtypes`` and ``shapes``; the engine then
allocates one receive buffer per tensor. Without checks that caller chooses how much memory the server
allocates (and keeps, for staged buckets). :func:`check_announced` therefore holds every announced tensor to the
engine's own model before any allocation:

* the name is a weight of the model (HF names, ``LocalEngine.weight_shapes()``), or a rotary ``inv_freq`` buffer
  some checkpoints carry (1-D, at most ``SKIPPED_MAX_NUMEL`` elements; received and ignored);
* the shape is the model's shape for that name;
* the dtype is one a trainer holds weights in (``ALLOWED_DTYPES``: float32, bfloat16, float16; the engine casts
  on copy), so no tensor is larger than the model's own weight at float32;
* no name comes twice in one update (staged buckets and the final one together).

:class:`StagingBudget` bounds the bytes received and staged over all groups of an engine together by
``budget_bytes(shapes)``: the model's size at float32 (plus ``SLACK_BYTES`` for the ignored buffers). A group
that needs room beyond it drops the staged buckets of idle groups (those not receiving at that moment: an update
abandoned by its sender); if that is not enough the update is refused.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Callable, Optional

import torch

from slick.engine.model import SKIPPED_SUFFIX

ALLOWED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SKIPPED_MAX_NUMEL = 4096            # a rotary inv_freq buffer has head_dim / 2 entries
SLACK_BYTES = 1 << 20               # room for such buffers on top of the model's float32 size


class StagingError(ValueError):
    """An announced tensor the engine will not allocate (message names the tensor and the field)."""


def engine_shapes(engine: Any) -> Optional[dict[str, tuple]]:
    """HF weight name -> shape of ``engine``'s model (``weight_shapes()``, else ``engine.model.shapes``); None if
    the engine exposes neither."""
    fn = getattr(engine, "weight_shapes", None)
    if callable(fn):
        return {str(k): tuple(v) for k, v in fn().items()}
    shapes = getattr(getattr(engine, "model", None), "shapes", None)
    if isinstance(shapes, dict):
        return {str(k): tuple(v) for k, v in shapes.items()}
    return None


def budget_bytes(shapes: dict[str, tuple]) -> int:
    """The most bytes an engine receives and stages at once: its model at float32, plus ``SLACK_BYTES``."""
    return 4 * sum(math.prod(s) for s in shapes.values()) + SLACK_BYTES


def check_announced(shapes: dict[str, tuple], metas: list, already: set) -> int:
    """Check ``(name, dtype, shape)`` triples against the model's ``shapes`` (module doc); ``already``: names
    staged earlier in this update. Returns the bytes they need; raises :class:`StagingError`."""
    seen = set(already)
    total = 0
    for name, dtype, shape in metas:
        if name in seen:
            raise StagingError(f"tensor {name!r} is announced twice in one update (names must be unique)")
        seen.add(name)
        if dtype not in ALLOWED_DTYPES:
            raise StagingError(f"tensor {name!r}: dtype {str(dtype).replace('torch.', '')} is not accepted "
                               f"(dtypes: float32, bfloat16, float16)")
        want = shapes.get(name)
        if want is None:
            if not (name.endswith(SKIPPED_SUFFIX) and len(shape) == 1 and shape[0] <= SKIPPED_MAX_NUMEL):
                raise StagingError(f"tensor {name!r} is not a weight of this model (names)")
        elif tuple(want) != tuple(shape):
            raise StagingError(f"tensor {name!r} has shape {list(shape)}; the model's is {list(want)} (shapes)")
        total += math.prod(shape) * dtype.itemsize
    return total


class StagingBudget:
    """Bytes held by each group (received or staged), bounded by ``limit`` over all groups together."""

    def __init__(self, limit: int):
        self.limit = int(limit)
        self.held: dict[str, int] = {}
        self._lock = threading.Lock()

    def total(self) -> int:
        with self._lock:
            return sum(self.held.values())

    def reserve(self, group: str, nbytes: int, idle: Callable[[], list[str]],
                drop: Callable[[str], None]) -> None:
        """Add ``nbytes`` to ``group``'s share. Over the limit, ``drop`` the groups ``idle()`` names (never
        ``group`` itself) until it fits; raises :class:`StagingError` when it still does not."""
        with self._lock:
            mine = self.held.get(group, 0)
            if mine + nbytes > self.limit:
                raise StagingError(f"this update announces {mine + nbytes} bytes; the engine takes at most "
                                   f"{self.limit} (its model at float32)")
            if sum(self.held.values()) + nbytes <= self.limit:
                self.held[group] = mine + nbytes
                return
        for other in idle():
            if other != group:
                drop(other)          # releases its share
                if self.total() + nbytes <= self.limit:
                    break
        with self._lock:
            if sum(self.held.values()) + nbytes > self.limit:
                busy = sorted(g for g, n in self.held.items() if n and g != group)
                others = sum(n for g, n in self.held.items() if g != group)
                raise StagingError(f"weight groups {busy} are receiving {others} bytes; this update's {nbytes} "
                                   f"more would exceed the engine's {self.limit} (its model at float32)")
            self.held[group] = self.held.get(group, 0) + nbytes

    def release(self, group: str) -> None:
        with self._lock:
            self.held.pop(group, None)

"""Split a stream of named tensors into buckets of at most ``bucket_bytes`` (pure; no I/O)."""
from __future__ import annotations

from typing import Iterable, Iterator

import torch


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def iter_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                 ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Yield lists of ``(name, tensor)`` in input order, each at most ``bucket_bytes`` in total; a tensor larger
    than that travels alone. Lazy: a tensor is read from ``named`` only when the bucket before it is full."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list = []
    size = 0
    for name, t in named:
        n = tensor_bytes(t)
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def with_last(items: Iterable) -> Iterator[tuple[object, bool]]:
    """``(item, is_last)`` for every item (reads one item ahead)."""
    it = iter(items)
    try:
        prev = next(it)
    except StopIteration:
        return
    for cur in it:
        yield prev, False
        prev = cur
    yield prev, True

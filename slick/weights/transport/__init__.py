"""Weight transports: how a new policy version's tensors reach the rollout engines.

One interface (``connect(engines)``, ``send(version, named_tensors)``, ``disconnect()``), three ways:

* ``disk`` (:mod:`.disk`): a safetensors directory written atomically (shards of at most ``bucket_bytes``, an
  index and a version marker); every engine loads it (``update_weights(path=...)``, over HTTP
  ``/update_weights_from_disk``). Works for any engine that can read the directory.
* ``broadcast`` (:mod:`.broadcast`): a standalone gloo (CPU) / NCCL (GPU) process group of the sender (rank 0)
  and every engine (ranks 1..k). HTTP engines join with ``/init_weights_update_group`` and receive every bucket
  with ``/update_weights_from_distributed`` (SGLang's API); in-process engines join in a thread.
* ``colocated`` (:mod:`.colocated`): in-process engines get the tensors themselves (no copy but the engine's
  cast into its own weights).

Engines apply every update all or nothing, between two decode steps, and take ``version`` as their weight
version. Every call is bounded by ``timeout_s``; errors name the engine (URL) that failed. See docs/weights.md.
"""
from __future__ import annotations

from typing import Iterable, Optional, Protocol, Sequence, runtime_checkable

import torch

from slick.weights.transport.broadcast import BroadcastTransport
from slick.weights.transport.colocated import ColocatedTransport
from slick.weights.transport.common import TransportError, engine_name, is_http  # noqa: F401 - names of this package
from slick.weights.transport.disk import DiskTransport

NAMES = ("disk", "broadcast", "colocated")
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024
DEFAULT_TIMEOUT_S = 600.0


@runtime_checkable
class WeightTransport(Protocol):
    name: str

    async def connect(self, engines: Sequence) -> None: ...

    async def send(self, version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    async def disconnect(self) -> None: ...


def make_transport(name: str, *, disk_dir: Optional[str] = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   timeout_s: float = DEFAULT_TIMEOUT_S, master_addr: str = "127.0.0.1",
                   model_dir: Optional[str] = None, backend: Optional[str] = None) -> WeightTransport:
    """Build a transport. ``disk_dir``: the directory the disk transport writes (required for it).
    ``bucket_bytes``: largest bucket (disk: shard size; broadcast: bytes per /update_weights_from_distributed).
    ``timeout_s``: bound on every engine call and collective. ``master_addr``: the address engines reach the
    sender's group at (broadcast). ``model_dir``: config/tokenizer files copied next to the disk weights (so
    the directory is a loadable HF model). ``backend``: broadcast's "gloo" or "nccl" (default: nccl when the
    tensors are on CUDA, else gloo)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    if name == "disk":
        if not disk_dir:
            raise ValueError("the disk weight transport needs disk_dir (a directory every engine can read)")
        return DiskTransport(disk_dir, bucket_bytes=bucket_bytes, timeout_s=timeout_s, model_dir=model_dir)
    if name == "broadcast":
        return BroadcastTransport(bucket_bytes=bucket_bytes, timeout_s=timeout_s, master_addr=master_addr,
                                  backend=backend)
    if name == "colocated":
        return ColocatedTransport(timeout_s=timeout_s)
    raise ValueError(f"unknown weight transport {name!r} (choose {', '.join(NAMES)})")

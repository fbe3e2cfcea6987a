"""Push the trainer's weights to rollout engines through a weight transport (``slick.weights.transport``).

``await sync_weights(trainer, engines, transport)`` sends ``trainer.named_weights()`` as version
``trainer.version`` and returns the elapsed seconds (the driver logs them as ``perf/update_weights_time``).

* ``transport`` is a :class:`slick.weights.transport.WeightTransport` kept by the caller (connected to ``engines``
  on first use, reused afterwards: the broadcast group is formed once), or a transport name ("disk",
  "broadcast", "colocated") for a one-shot transfer (connect, send, disconnect).
* The older ``mode=`` keyword still works: ``"tensors"`` is the colocated transport, ``"disk"`` the disk
  transport writing ``disk_dir``.
* Instead of a trainer, ``source`` may be an iterable of ``(hf_name, tensor)``; then ``version`` is required.
* A LoRA trainer's ``adapter_payload()`` travels alone (``transport.send_adapter``) when the transport can carry it
  and every engine accepts adapters (``slick.weights.lora_sync``); otherwise the merged ``named_weights()`` do.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

from slick.weights.lora_sync import accept_adapters
from slick.weights.transport import DEFAULT_BUCKET_BYTES, DEFAULT_TIMEOUT_S, make_transport

LEGACY_MODES = {"tensors": "colocated", "disk": "disk"}


async def sync_weights(source, engines: Sequence, transport=None, *, mode: Optional[str] = None,
                       disk_dir: Optional[str] = None, version: Optional[int] = None,
                       bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = DEFAULT_TIMEOUT_S) -> float:
    """Update every engine to ``source``'s weights; returns the elapsed seconds (module doc)."""
    t0 = time.perf_counter()
    if hasattr(source, "named_weights"):
        named = None                   # gathered only when they travel (a Ray group gathers on the call)
        version = source.version if version is None else version
    else:
        named = source
        if version is None:
            raise ValueError("sync_weights(named_tensors, ...) needs version=")
    if transport is None:
        if mode is None:
            mode = "tensors"
        if mode not in LEGACY_MODES:
            raise ValueError(f"unknown weight sync mode '{mode}' (choose tensors, disk)")
        transport = LEGACY_MODES[mode]
    one_shot = isinstance(transport, str)
    if one_shot:
        transport = make_transport(transport, disk_dir=disk_dir, bucket_bytes=bucket_bytes, timeout_s=timeout_s,
                                   model_dir=getattr(source, "model_path", None))
    if one_shot or not getattr(transport, "engines", None):
        await transport.connect(list(engines))
    try:
        adapter = source.adapter_payload() if hasattr(source, "adapter_payload") else None
        if adapter is not None and hasattr(transport, "send_adapter") and await accept_adapters(transport.engines):
            await transport.send_adapter(int(version), adapter)   # LoRA, adapter only (slick.weights.lora_sync)
        else:
            await transport.send(int(version), source.named_weights() if named is None else named)
    finally:
        if one_shot:
            await transport.disconnect()
    return time.perf_counter() - t0

"""Push the trainer's weights to rollout engines (the Engine protocol of slick/engine/base.py).

* ``mode="tensors"``: in-process engines get ``named_tensors=trainer.named_weights()`` (a fresh iterator
  per engine; HF names, tied weights once; the engine casts to its own dtype).
* ``mode="disk"``: one HF directory is written atomically to ``disk_dir`` and every engine is told
  ``update_weights(path=disk_dir)`` (HTTP engines load it via ``/update_weights_from_disk``).

Engines are updated concurrently; every engine is told ``version=trainer.version``.
"""
from __future__ import annotations

import asyncio
import time
from typing import Optional, Sequence

from slick.train.checkpoint import save_hf


async def sync_weights(trainer, engines: Sequence, *, mode: str = "tensors",
                       disk_dir: Optional[str] = None) -> float:
    """Update every engine to the trainer's current weights; returns the elapsed seconds."""
    t0 = time.perf_counter()
    if mode == "tensors":
        await asyncio.gather(*(e.update_weights(named_tensors=trainer.named_weights(), version=trainer.version)
                               for e in engines))
    elif mode == "disk":
        if not disk_dir:
            raise ValueError("sync_weights(mode='disk') needs disk_dir")
        await asyncio.to_thread(save_hf, disk_dir, trainer)
        await asyncio.gather(*(e.update_weights(path=str(disk_dir), version=trainer.version)
                               for e in engines))
    else:
        raise ValueError(f"unknown weight sync mode '{mode}' (choose tensors, disk)")
    return time.perf_counter() - t0

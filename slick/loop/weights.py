"""The run's engines as a weight sink (``slick.train.protocol.WeightSink``): where ``trainer.send_weights`` goes.

:class:`EngineWeights` resolves --weight-transport for the run's engines once, and sends weights from this
process through that transport, connected on first use and kept connected between syncs (the broadcast group is
formed once); a replacement engine (--use-fault-tolerance) joins before a sync or after it, never during one
(the engines' ``weights_lock``). Trainer ranks on Ray push to their engines themselves when the sink says the
engines are theirs to reach (``ranks_reach_engines``); the disk transport is always written here, from the
gathered weights (one writer; the engines' hosts must see the directory: one machine or a shared file system).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from slick.config import Config, ConfigView
from slick.weights.transport import make_transport
from slick.weights.sync import sync_weights


def resolve_transport(cfg: Config | ConfigView, engines, cluster) -> str:
    """--weight-transport, with auto resolved for ``engines`` (validate_config resolves it too)."""
    name = cfg.weight_transport
    if name != "auto":
        return name
    if engines.sync_mode == "ray":
        return "colocated" if cluster.layout.colocate else "disk"
    return "colocated" if engines.sync_mode == "tensors" else "disk"


class EngineWeights:
    """The run's engines (an ``EngineSet``) behind one weight transport (module doc)."""

    def __init__(self, cfg: Config | ConfigView, engines, cluster, run_dir: Path):
        cfg = cfg.view("cluster", "train")
        self.engines = engines
        self.transport = resolve_transport(cfg, engines, cluster)
        self.ranks_reach_engines = engines.sync_mode == "ray"   # engine actors the trainer ranks push to
        self.disk_dir = self.dir_for(run_dir)
        self.bucket_bytes = int(cfg.weight_bucket_mb) << 20
        self.timeout_s = float(cfg.dist_timeout)
        self.model_dir = cfg.hf_checkpoint
        self._transport = None      # connected on the first send from this process, kept until close

    @staticmethod
    def dir_for(run_dir) -> str:
        """The disk transport's directory of a run (the only one launched vLLM servers load weights from)."""
        return str(Path(run_dir) / "weights")

    @property
    def worker_urls(self) -> list:
        return self.engines.worker_urls

    async def send(self, source: Any) -> float:
        """``source``'s weights (``named_weights()``, ``version``) to every engine from this process; seconds."""
        if self._transport is None:
            self._transport = make_transport(self.transport, disk_dir=self.disk_dir, bucket_bytes=self.bucket_bytes,
                                             timeout_s=self.timeout_s, model_dir=self.model_dir)
        if self.engines.weights_lock is None:
            return await sync_weights(source, [self.engines.engine], self._transport)
        async with self.engines.weights_lock:   # a replacement engine joins before this sync or after it
            return await sync_weights(source, [self.engines.engine], self._transport)

    async def close(self) -> None:
        """Disconnect the transport (idempotent)."""
        if self._transport is not None:
            transport, self._transport = self._transport, None
            await transport.disconnect()

"""The broadcast weight transport's calls to one worker (SGLang's ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group``), as a mixin of
:class:`slick.engines.client.HttpEngine`, which provides ``control(url, path, payload, timeout)`` and the engine's
``_version``."""
from __future__ import annotations

from typing import Optional


class WeightGroupCalls:
    """Joining, feeding and leaving a worker's weight-update process group (``slick.weights.transport.broadcast``)."""

    async def init_weights_update_group(self, url: str, *, master_address: str, master_port: int,
                                        rank_offset: int, world_size: int, group_name: str = "weight_update_group",
                                        backend: str = "gloo", timeout_s: float = 600.0) -> dict:
        """POST /init_weights_update_group to worker ``url`` (SGLang's fields, plus slick's ``timeout_s``); the
        answer comes once every member has joined. The sender (rank 0) must join meanwhile."""
        return await self.control(url, "/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend,
            "timeout_s": float(timeout_s)}, timeout=timeout_s + 10)

    async def update_weights_from_distributed(self, url: str, names: list, dtypes: list, shapes: list, *,
                                              group_name: str = "weight_update_group",
                                              version: Optional[int] = None, last_bucket: bool = True,
                                              timeout: Optional[float] = None) -> dict:
        """POST /update_weights_from_distributed to worker ``url``: it receives one broadcast per tensor from
        rank 0 while the sender broadcasts; ``last_bucket=False`` stages (slick), the last one applies."""
        payload = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                   "group_name": group_name, "flush_cache": True, "last_bucket": bool(last_bucket)}
        if version is not None:
            payload["weight_version"] = str(int(version))
        out = await self.control(url, "/update_weights_from_distributed", payload, timeout=timeout)
        if last_bucket and version is not None:
            self._version = int(version)
        return out

    async def destroy_weights_update_group(self, url: str, group_name: str = "weight_update_group",
                                           timeout: Optional[float] = 30.0) -> dict:
        """POST /destroy_weights_update_group to worker ``url``."""
        return await self.control(url, "/destroy_weights_update_group", {"group_name": group_name},
                                  timeout=timeout)

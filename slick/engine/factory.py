"""Build the rollout engine a config asks for: in-process LocalEngine, or HTTP workers (+ router)."""
from __future__ import annotations

import logging

log = logging.getLogger("slick.engine")


class EngineSet:
    """The engine the rollout talks to, the processes started for it, and how weights reach it."""

    def __init__(self, engine, sync_mode: str, processes=()):
        self.engine, self.sync_mode, self.processes = engine, sync_mode, list(processes)

    async def close(self) -> None:
        await self.engine.close()
        for p in reversed(self.processes):
            p.stop()

    def close_sync(self) -> None:
        """Stop what was started, without an event loop (for failures during set-up)."""
        if hasattr(self.engine, "close_sync"):
            self.engine.close_sync()
        for p in reversed(self.processes):
            p.stop()


def make_engines(cfg) -> EngineSet:
    """--rollout-engine local: LocalEngine in this process (weights synced as tensors).
    --rollout-engine http: HttpEngine over --rollout-urls, or over `slick serve` workers launched from
    --hf-checkpoint; --router sglang puts the real sglang-router in front (weights synced via disk).

    ``cfg.sglang`` (the ``--sglang-*`` options) reaches the engines slick starts: the LocalEngine gets the keys
    of ``slick.engine.sglang_args.KNOWN``, launched workers get every option as ``--sglang-KEY=VALUE``; keys
    with no meaning for slick's engine are named in a warning. Engines at --rollout-urls are already running."""
    from slick.engine.sglang_args import engine_options, to_argv, unknown_warning

    sglang = dict(getattr(cfg, "sglang", None) or {})
    options, unknown = engine_options(sglang)
    if sglang and cfg.rollout_engine == "http" and cfg.rollout_urls:
        log.warning("--sglang-* options %s have no effect: the engines at --rollout-urls are already running",
                    sorted(sglang))
    elif unknown:
        log.warning("%s", unknown_warning(unknown, "slick"))
    if cfg.rollout_engine == "local":
        from slick.engine.local import LocalEngine

        kwargs = dict(dtype=cfg.dtype, device=cfg.device, max_running=cfg.engine_max_running, seed=cfg.rollout_seed)
        kwargs.update(options)
        eng = LocalEngine(cfg.hf_checkpoint, **kwargs)
        return EngineSet(eng, "tensors")
    from slick.engine.client import HttpEngine

    procs, urls = [], list(cfg.rollout_urls)
    if not urls:
        from slick.engine.router import launch_workers

        procs = launch_workers(cfg.hf_checkpoint, cfg.rollout_num_workers, dtype=cfg.dtype,
                               max_running=cfg.engine_max_running, extra_args=to_argv(sglang))
        urls = [p.url for p in procs]
    worker_urls = list(urls)
    if cfg.router == "sglang":
        from slick.engine.router import launch_router

        router = launch_router(urls)
        procs.append(router)
        urls = [router.url]
        log.info("sglang-router at %s in front of %s", router.url, worker_urls)
    # generation goes through the router; weight updates and aborts go to every worker directly
    eng = HttpEngine(urls, concurrency=cfg.rollout_concurrency, timeout=cfg.rollout_timeout,
                     control_urls=worker_urls)
    return EngineSet(eng, "disk", procs)

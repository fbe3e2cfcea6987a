"""Build the rollout engine a config asks for: in-process LocalEngine, or HTTP workers (+ router)."""
from __future__ import annotations

import logging

log = logging.getLogger("slick.engine")


class EngineSet:
    """The engine the rollout talks to, the processes started for it, and how weights reach it."""

    def __init__(self, engine, sync_mode: str, processes=(), worker_urls=()):
        self.engine, self.sync_mode, self.processes = engine, sync_mode, list(processes)
        self.worker_urls = list(worker_urls)   # the engine servers themselves (behind the router, if any)

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


def make_engines(cfg, cluster=None, trainer=None) -> EngineSet:
    """--rollout-engine local: LocalEngine in this process (weights synced as tensors).
    --rollout-engine http: HttpEngine over --rollout-urls, or over `slick serve` workers launched from
    --hf-checkpoint; --router sglang puts the real sglang-router in front (weights synced via disk).

    ``cfg.sglang`` (the ``--sglang-*`` options) reaches the engines slick starts: the LocalEngine gets the keys
    of ``slick.engine.sglang_args.KNOWN``, launched workers get every option as ``--sglang-KEY=VALUE``; keys
    with no meaning for slick's engine are named in a warning. Engines at --rollout-urls are already running.

    On Ray (``cluster`` with engines in its layout) the engines are `slick serve` servers in actors: their own
    (disaggregated) or inside ``trainer``'s rank actors (--colocate); the rollout reaches them over HTTP, through
    the real sglang-router with --router sglang, and the trainer ranks push weights to them themselves
    (sync mode "ray": ``RayTrainerGroup.send_weights`` with --weight-transport)."""
    from slick.engine.sglang_args import engine_options, to_argv, unknown_warning

    sglang = dict(getattr(cfg, "sglang", None) or {})
    options, unknown = engine_options(sglang)
    if sglang and cfg.rollout_engine == "http" and cfg.rollout_urls:
        log.warning("--sglang-* options %s have no effect: the engines at --rollout-urls are already running",
                    sorted(sglang))
    elif unknown:
        log.warning("%s", unknown_warning(unknown, "slick"))
    if cluster is not None and cluster.layout is not None and cluster.layout.num_engines:
        return _ray_engines(cfg, cluster, trainer)
    if cfg.rollout_engine == "local":
        from slick.engine.local import LocalEngine

        kwargs = dict(dtype=cfg.dtype, device=cfg.device, max_running=cfg.engine_max_running, seed=cfg.rollout_seed)
        kwargs.update(options)
        eng = LocalEngine(cfg.hf_checkpoint, **kwargs)
        return EngineSet(eng, "tensors")
    procs, urls = [], list(cfg.rollout_urls)
    if not urls:
        from slick.engine.router import launch_workers

        procs = launch_workers(cfg.hf_checkpoint, cfg.rollout_num_workers, dtype=cfg.dtype,
                               max_running=cfg.engine_max_running, extra_args=to_argv(sglang))
        urls = [p.url for p in procs]
    return _http_engines(cfg, urls, procs, "disk")


def _ray_engines(cfg, cluster, trainer) -> EngineSet:
    """Engine servers in Ray actors (their own, or the trainer ranks' with --colocate) behind an HttpEngine."""
    from slick.cluster.engine_actor import engine_kwargs, start_engine_actors

    timeout = float(cfg.ray_start_timeout)
    if cluster.layout.colocate:
        if trainer is None or not hasattr(trainer, "start_colocated_engines"):
            raise ValueError("--colocate on Ray runs each engine inside a trainer rank's actor: it needs the "
                             "trainer (not --debug-rollout-only)")
        return _http_engines(cfg, trainer.start_colocated_engines(engine_kwargs(cfg), timeout), [], "ray")
    actors = start_engine_actors(cluster, cfg, timeout)
    try:
        return _http_engines(cfg, actors.urls, [actors], "ray")
    except BaseException:
        actors.stop()
        raise


def _http_engines(cfg, urls: list, procs: list, sync_mode: str) -> EngineSet:
    """An HttpEngine over ``urls`` (through the sglang-router with --router sglang); ``procs`` stop with it."""
    from slick.engine.client import HttpEngine

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
    return EngineSet(eng, sync_mode, procs, worker_urls)

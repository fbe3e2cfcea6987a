"""Build the rollout engine a config asks for: in-process LocalEngine, HTTP workers (+ router), or engine
servers in Ray actors."""
from __future__ import annotations

import asyncio
import logging
import os
import secrets

import torch

from slick.cluster.engine_actor import engine_kwargs, start_engine_actors
from slick.config import Config, ConfigView
from slick.engines.client import HttpEngine
from slick.engines.detect import server_kind
from slick.engines.fault import EngineDied, Recovery
from slick.engines.health import HealthMonitor
from slick.engine.arch import ArchConfig
from slick.engine.local import LocalEngine
from slick.engines.launch_ready import log_tail
from slick.engines.router import RouterProcess, WorkerProcess, launch_router, launch_workers
from slick.engines.vllm_client import VllmEngine
from slick.engines.sglang_client import SglangEngine
from slick.engines.sglang_launch import launch_sglang
from slick.engines.vllm_launch import launch_vllm, lora_options
from slick.train.lora_spec import spec_from_config
from slick.train.precision import resolve_dtype
from slick.serve.sglang_args import engine_options, to_argv, unknown_warning

log = logging.getLogger("slick.engine")


class EngineSet:
    """The engine the rollout talks to, the processes started for it, and how weights reach it."""

    def __init__(self, engine, sync_mode: str, processes=(), worker_urls=(), relaunch=None):
        self.engine, self.sync_mode, self.processes = engine, sync_mode, list(processes)
        self.worker_urls = list(worker_urls)   # the engine servers themselves (behind the router, if any)
        self.relaunch = relaunch               # failed url -> a new worker (launched HTTP workers, Ray actors)
        self.monitor = self.recovery = None
        self.failure = None                    # the EngineDied that ended the run (no --use-fault-tolerance)
        self.weights_lock = None               # held by weight syncs and by a replacement's bring-up

    def watch(self, cfg: Config, bring_up=None, pending=None) -> None:
        """Start watching the engines (slick/engines/health.py) on the running event loop. Launched processes
        are always watched; a failure ends the run (``self.failure``, the calling task is cancelled) unless
        ``cfg.use_fault_tolerance``, which health-checks every worker and replaces failed ones
        (slick/engines/fault.py): ``bring_up(url)`` must load the engines' current weights into ``url`` and
        return their version. ``pending()`` names the sample indices in flight, for the error message."""
        if self.monitor is not None:
            return
        main = asyncio.current_task()
        self.weights_lock = asyncio.Lock()
        router = next((p for p in self.processes if isinstance(p, RouterProcess)), None)
        workers = {p.url: p for p in self.processes if isinstance(p, WorkerProcess)}

        def fatal(err: EngineDied) -> None:
            if self.failure is None:
                self.failure = err
                main.cancel()

        def watched() -> dict:
            procs = dict(self.recovery.workers) if self.recovery is not None else dict(workers)
            if router is not None:
                procs[router.url] = router
            return procs

        async def died(url: str, reason: str) -> None:
            if url == getattr(router, "url", None) or self.recovery is None:
                proc = watched().get(url)
                what = "sglang-router" if proc is router and router is not None else "engine worker"
                rids = sorted(getattr(self.engine, "inflight", dict)())
                samples = sorted(pending()) if pending is not None else []
                fatal(EngineDied(
                    f"{what} {url} (pid {getattr(proc, 'pid', '?')}) failed: {reason}; pending samples (indices): "
                    f"{samples}"
                    + (f"; requests in flight: {rids}" if rids else "")
                    + ("" if self.recovery is not None else "; --use-fault-tolerance would replace the worker and "
                       "go on")
                    + (f"; last lines of {proc.log_path}:\n{log_tail(proc.log_path)}"   # the cause is in its log
                       if getattr(proc, "log_path", None) else ""), url, getattr(proc, "pid", None)))
                return
            await self.recovery.failed(url, reason)

        if cfg.use_fault_tolerance:
            if self.relaunch is None:
                raise ValueError("--use-fault-tolerance needs engines slick launched (a relaunch function)")
            self.engine.fault_tolerant = True
            self.recovery = Recovery(self.engine, workers, self.relaunch, router=router, bring_up=bring_up,
                                     weights_lock=self.weights_lock, on_fatal=fatal)
        if not workers and router is None and self.recovery is None:
            return                              # engines slick did not launch: nothing to watch
        self.monitor = HealthMonitor(lambda: list(self.engine.control_urls), died, processes=watched,
                                     interval=cfg.rollout_health_check_interval,
                                     timeout=cfg.rollout_health_check_timeout,
                                     first_wait=cfg.rollout_health_check_first_wait,
                                     health_checks=self.recovery is not None, poll=0.2,
                                     path=self.engine.health_path)
        self.monitor.start()

    def fault_metrics(self) -> dict:
        """fault/* metrics of --use-fault-tolerance (empty without it)."""
        return self.recovery.metrics() if self.recovery is not None else {}

    async def _stop_watching(self) -> None:
        if self.monitor is not None:
            await self.monitor.stop()
        if self.recovery is not None:
            await self.recovery.close()
            for p in self.recovery.started:
                if p not in self.processes:
                    self.processes.insert(0, p)

    async def close(self) -> None:
        try:
            await self._stop_watching()
            await self.engine.close()
        finally:
            for p in reversed(self.processes):
                p.stop()

    def close_sync(self) -> None:
        """Stop what was started, without an event loop (for failures during set-up)."""
        if hasattr(self.engine, "close_sync"):
            self.engine.close_sync()
        if self.recovery is not None:
            self.processes[:0] = [p for p in self.recovery.started if p not in self.processes]
        for p in reversed(self.processes):
            p.stop()


def make_engines(cfg: Config | ConfigView, cluster=None, trainer=None, weight_dir=None) -> EngineSet:
    """--rollout-engine local: LocalEngine in this process (weights synced as tensors).
    --rollout-engine http: HttpEngine over --rollout-urls, or over `slick serve` workers launched from
    --hf-checkpoint; --router sglang puts the real sglang-router in front (weights synced via disk).

    ``cfg.sglang`` (the ``--sglang-*`` options) reaches the engines slick starts: the LocalEngine gets the keys
    of ``slick.serve.sglang_args.KNOWN``, launched workers get every option as ``--sglang-KEY=VALUE``; keys
    with no meaning for slick's engine are named in a warning. Engines at --rollout-urls are already running.

    On Ray (``cluster`` with engines in its layout) the engines are `slick serve` servers in actors: their own
    (disaggregated) or inside ``trainer``'s rank actors (--colocate); the rollout reaches them over HTTP, through
    the real sglang-router with --router sglang, and the trainer ranks push weights to them themselves
    (sync mode "ray": ``RayTrainerGroup.send_weights`` with --weight-transport).

    --rollout-engine vllm / sglang: real vLLM (or SGLang) servers launched from --hf-checkpoint
    (slick/engines/vllm_launch.py), or found at --rollout-urls; weights reach them through the disk transport's
    directory ``weight_dir`` (the only directory the launched vLLM servers load weights from).

    Reads the rollout, data, train, cluster, logging and lora groups."""
    cfg = cfg.view("rollout", "data", "train", "cluster", "logging", "lora")
    if cfg.rollout_engine in ("vllm", "sglang"):
        return _server_engines(cfg, weight_dir)
    sglang = dict(cfg.sglang or {})
    _, unknown = engine_options(sglang)
    if sglang and cfg.rollout_engine == "http" and cfg.rollout_urls:
        log.warning("--sglang-* options %s have no effect: the engines at --rollout-urls are already running",
                    sorted(sglang))
    elif unknown:
        log.warning("%s", unknown_warning(unknown, "slick"))
    if cluster is not None and cluster.layout is not None and cluster.layout.num_engines:
        return _ray_engines(cfg, cluster, trainer, weight_dir)
    if cfg.rollout_engine == "local":
        eng = LocalEngine(cfg.hf_checkpoint, **engine_kwargs(cfg))
        return EngineSet(eng, "tensors")
    procs, urls, relaunch = [], list(cfg.rollout_urls), None
    if not urls:
        n = cfg.rollout_num_workers
        kw = dict(dtype=cfg.dtype, max_running=cfg.engine_max_running, extra_args=to_argv(sglang),
                  threads=max(1, (os.cpu_count() or 1) // n))
        procs = launch_workers(cfg.hf_checkpoint, n, **kw)
        urls = [p.url for p in procs]
        relaunch = lambda url: launch_workers(cfg.hf_checkpoint, 1, **kw)[0]   # noqa: E731 - a replacement worker
    elif cfg.router == "none" and all(server_kind(u) == "vllm" for u in urls):   # vLLM's API, not SGLang's
        log.info("--rollout-urls %s are vLLM servers: driving them with vLLM's API (--rollout-engine vllm)", urls)
        return EngineSet(VllmEngine(urls, concurrency=cfg.rollout_concurrency, timeout=cfg.rollout_timeout),
                         "disk", [], urls)
    engines = _http_engines(cfg, urls, procs, "disk")
    engines.relaunch = relaunch
    return engines


def _ray_engines(cfg: ConfigView, cluster, trainer, weight_dir=None) -> EngineSet:
    """Engine servers in Ray actors (their own, or the trainer ranks' with --colocate) behind an HttpEngine."""
    timeout = float(cfg.ray_start_timeout)
    if cluster.layout.colocate:
        if trainer is None or not hasattr(trainer, "start_colocated_engines"):
            raise ValueError("--colocate on Ray runs each engine inside a trainer rank's actor: it needs the "
                             "trainer (not --debug-rollout-only)")
        return _http_engines(cfg, trainer.start_colocated_engines(engine_kwargs(cfg), timeout), [], "ray")
    if cfg.rollout_engine == "vllm":
        return _ray_vllm_engines(cfg, cluster, timeout, weight_dir)
    actors = start_engine_actors(cluster, cfg, timeout)
    try:
        engines = _http_engines(cfg, list(actors.urls), [actors], "ray")
        engines.relaunch = lambda url: actors.restart(url, timeout)   # --use-fault-tolerance: a new actor
        return engines
    except BaseException:
        actors.stop()
        raise


def _http_engines(cfg: ConfigView, urls: list, procs: list, sync_mode: str) -> EngineSet:
    """An HttpEngine over ``urls`` (through the sglang-router with --router sglang); ``procs`` stop with it."""
    worker_urls = list(urls)
    if cfg.router == "sglang":
        router = launch_router(urls)
        procs.append(router)
        urls = [router.url]
        log.info("sglang-router at %s in front of %s", router.url, worker_urls)
    # generation goes through the router; weight updates and aborts go to every worker directly
    eng = HttpEngine(urls, concurrency=cfg.rollout_concurrency, timeout=cfg.rollout_timeout,
                     control_urls=worker_urls, server_logs=server_logs(procs), routing=routing_shape(cfg))
    return EngineSet(eng, sync_mode, procs, worker_urls)


def routing_shape(cfg: ConfigView):
    """``(MoE layers, experts per token)`` of the run's model when it replays routing (``--use-routing-replay`` on a
    mixture-of-experts model, from its config.json): the HTTP client asks the servers for every generation's routed
    experts and needs these to read them. None otherwise (a dense model has nothing to replay)."""
    if not cfg.use_routing_replay or not cfg.hf_checkpoint:
        return None
    moe = ArchConfig.from_dir(cfg.hf_checkpoint).moe
    return None if moe is None else (len(moe.layers), moe.top_k)


def server_logs(procs: list) -> dict:
    """url -> log files to quote when requests to it fail: each launched server's own log; the router's is
    its workers' (a router passes their 500s on; the cause is in their logs)."""
    workers = [p for p in procs if isinstance(p, WorkerProcess) and getattr(p, "log_path", None)]
    logs = {p.url: [p.log_path] for p in workers}
    for p in procs:
        if isinstance(p, RouterProcess):
            logs[p.url] = [w.log_path for w in workers]
    return logs


def _vllm_launch_kwargs(cfg: ConfigView, weight_dir, key: str) -> dict:
    """launch_vllm keyword arguments of a run (the servers' dtype follows the trainer's)."""
    dtype = "float32" if resolve_dtype(cfg.dtype, torch.device("cpu")) == torch.float32 else "bfloat16"
    spec = spec_from_config(cfg)    # LoRA: the servers load the adapter itself (slick.weights.lora_sync)
    lora = lora_options(spec.rank) if spec is not None else {}
    return dict(weight_dir=weight_dir, python=cfg.rollout_engine_python, dtype=dtype, seed=cfg.rollout_seed,
                api_key=key, options={"max_logprobs": max(20, cfg.mismatch_probe_top_k), **lora, **cfg.vllm})


def _ray_vllm_engines(cfg: ConfigView, cluster, timeout: float, weight_dir) -> EngineSet:
    """One vLLM server per engine bundle, each in a Ray actor; weights through the driver's disk transport."""
    key = secrets.token_hex(16)
    actors = start_engine_actors(cluster, cfg, max(timeout, cfg.rollout_startup_timeout),
                                 vllm=_vllm_launch_kwargs(cfg, weight_dir, key))
    eng = VllmEngine(list(actors.urls), api_key=key, concurrency=cfg.rollout_concurrency, timeout=cfg.rollout_timeout)
    engines = EngineSet(eng, "disk", [actors], list(actors.urls))
    engines.relaunch = lambda url: actors.restart(url, max(timeout, cfg.rollout_startup_timeout))
    return engines


def _server_engines(cfg: ConfigView, weight_dir) -> EngineSet:
    """vLLM servers (VllmEngine) or SGLang servers (SglangEngine; behind the real sglang-router with --router
    sglang): at --rollout-urls, or launched here."""
    vllm = cfg.rollout_engine == "vllm"
    if cfg.rollout_urls:
        return _engine_set(cfg, list(cfg.rollout_urls), [], None)
    n = cfg.rollout_num_workers
    key = secrets.token_hex(16)     # every server launched for this run, replacements included, needs it
    threads = max(1, (os.cpu_count() or 1) // n)
    if vllm:
        kw = _vllm_launch_kwargs(cfg, weight_dir, key)   # max_logprobs: the mismatch probe's top-k
        launch = lambda k: launch_vllm(cfg.hf_checkpoint, k, startup_timeout=cfg.rollout_startup_timeout,  # noqa: E731
                                       threads=threads, **kw)
    else:
        dtype = "float32" if resolve_dtype(cfg.dtype, torch.device("cpu")) == torch.float32 else "bfloat16"
        launch = lambda k: launch_sglang(cfg.hf_checkpoint, k, options=cfg.sglang,  # noqa: E731
                                         python=cfg.rollout_engine_python, dtype=dtype, seed=cfg.rollout_seed,
                                         threads=threads, startup_timeout=cfg.rollout_startup_timeout, api_key=key)
    log.info("starting %d %s server(s) for %s (up to %.0fs)", n, cfg.rollout_engine, cfg.hf_checkpoint,
             cfg.rollout_startup_timeout)
    procs = launch(n)
    engines = _engine_set(cfg, [p.url for p in procs], procs, key)
    engines.relaunch = lambda url: launch(1)[0]
    return engines


def _engine_set(cfg: ConfigView, urls: list, procs: list, key) -> EngineSet:
    """The client over engine servers ``urls``; SGLang's go through a sglang-router with --router sglang (it
    is stopped with them), while weight updates, pauses and aborts go to every server directly."""
    kw = dict(api_key=key, concurrency=cfg.rollout_concurrency, timeout=cfg.rollout_timeout)
    if cfg.rollout_engine == "vllm":
        return EngineSet(VllmEngine(urls, server_logs=server_logs(procs), **kw), "disk", procs, urls)
    front = urls
    if cfg.router == "sglang":
        try:
            router = launch_router(urls)
        except BaseException:
            for p in procs:
                p.stop(timeout=10)
            raise
        procs = [*procs, router]
        front = [router.url]
        log.info("sglang-router at %s in front of %s", router.url, urls)
    return EngineSet(SglangEngine(front, control_urls=urls, server_logs=server_logs(procs), **kw), "disk", procs,
                     urls)

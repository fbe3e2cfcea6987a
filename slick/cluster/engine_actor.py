"""Rollout engines on Ray: a `slick serve` server (SlickServer + LocalEngine) in an actor's process, on a free
127.0.0.1 port; the driver talks to it over HTTP like any SGLang server. With ``--rollout-engine vllm`` the actor
hosts a vLLM server process instead (:class:`VllmActor`).

:class:`EngineHost` runs the server on an event loop of its own thread, so it can live in a dedicated engine
actor (disaggregated) or inside a trainer rank's actor (``--colocate``: weights are then handed over in the
same process). The ``--sglang-*`` options reach the LocalEngine as they do for `slick serve`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Optional

from slick.cluster.actors import set_actor_threads, wait_all
from slick.config import Config, ConfigView
from slick.engine.local import LocalEngine
from slick.engines.vllm_launch import launch_vllm
from slick.serve.server import SlickServer
from slick.serve.sglang_args import engine_options

log = logging.getLogger("slick.cluster")


def engine_kwargs(cfg: Config | ConfigView) -> dict:
    """LocalEngine keyword arguments of a run (the same as the in-process engine's, --sglang-* included)."""
    options, _ = engine_options(dict(cfg.sglang or {}))
    kwargs = dict(dtype=cfg.dtype, device=cfg.device, max_running=cfg.engine_max_running, seed=cfg.rollout_seed)
    kwargs.update(options)
    return kwargs


class EngineHost:
    """A LocalEngine behind a SlickServer on ``host``:free port, served from a daemon thread's event loop."""

    def __init__(self, model_path: str, engine_kwargs: dict, host: str = "127.0.0.1"):
        self.model_path, self.kwargs, self.host = str(model_path), dict(engine_kwargs), host
        self.engine = None
        self.url: Optional[str] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._stop: Optional[asyncio.Event] = None
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None

    def start(self, timeout_s: float = 300.0) -> str:
        """Load the engine, listen, and return the server's URL."""
        self.engine = LocalEngine(self.model_path, threaded=True, **self.kwargs)
        self._thread = threading.Thread(target=self._serve, name="slick-engine-host", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise TimeoutError(f"engine server in pid {os.getpid()} did not listen within {timeout_s:g}s")
        if self._error is not None:
            raise RuntimeError(f"engine server in pid {os.getpid()} failed to start: {self._error}") from self._error
        return self.url

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as e:  # noqa: BLE001 - reported to start()
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        from aiohttp import web

        server = SlickServer(self.engine, model_path=self.model_path, host=self.host,
                             server_args={"host": self.host, "pid": os.getpid(), **self.kwargs})
        runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self.url = f"http://{self.host}:{runner.addresses[0][1]}"
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await server.shutdown(grace_s=2.0)
        await runner.cleanup()

    def update_weights(self, named_tensors, version: int) -> int:
        """In-process weight update (pause-free: the engine copies between two scheduler steps)."""
        return self.engine.update_weights_sync(named_tensors=named_tensors, version=version)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.engine is not None:
            self.engine.close_sync()
            self.engine = None


class EngineActor:
    """The body of a Ray actor hosting one engine (wrapped with ``ray.remote`` by :func:`start_engine_actors`)."""

    def __init__(self, model_path: str, engine_kwargs: dict, slots_on_node: int):
        set_actor_threads(slots_on_node)
        self.host = EngineHost(model_path, engine_kwargs)

    def start(self, timeout_s: float) -> str:
        return self.host.start(timeout_s)

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        self.host.stop()


class VllmActor:
    """The body of a Ray actor hosting one vLLM server (``--rollout-engine vllm`` on Ray): the server is a process
    of its own on the actor's node, with the actor's share of the cores, watched by the actor (it exits when the
    actor does); weights reach it from the driver's disk transport directory (one machine or a shared file system)."""

    def __init__(self, model_path: str, launch_kwargs: dict, slots_on_node: int):
        set_actor_threads(slots_on_node)
        self.model_path, self.kwargs = str(model_path), dict(launch_kwargs, threads=max(1, slots_on_node))
        self.server = None

    def start(self, timeout_s: float) -> str:
        (self.server,) = launch_vllm(self.model_path, 1, startup_timeout=timeout_s, **self.kwargs)
        return self.server.url

    def pid(self) -> int:
        return self.server.pid if self.server is not None else os.getpid()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class EngineActors:
    """The engine actors of a run: their URLs and pids; :meth:`stop` ends them (the EngineSet calls it);
    :meth:`restart` replaces one (--use-fault-tolerance)."""

    def __init__(self, actors: list, urls: list, pids: list, start=None):
        self.actors, self.urls, self.pids = actors, urls, pids
        self._start = start        # i -> a new actor handle for engine i (on the same placement-group bundle)

    def restart(self, url: str, timeout_s: float) -> "ActorWorker":
        """Kill the actor serving ``url`` and start a new one on its bundle; returns a handle of the new one
        once its server answers (both bounded by ``timeout_s``; RankError names the engine otherwise)."""
        import ray

        i = self.urls.index(url.rstrip("/"))
        try:
            ray.kill(self.actors[i], no_restart=True)
        except Exception as e:  # noqa: BLE001 - already dead
            log.debug("engine actor %d kill: %s", i, e)
        actor = self._start(i)
        self.actors[i] = actor
        name = f"engine actor {i} (replacement)"
        new_url, = wait_all([actor.start.remote(timeout_s)], [name], timeout_s, "start its server")
        pid, = wait_all([actor.pid.remote()], [name], timeout_s, "report its pid")
        self.urls[i], self.pids[i] = new_url, pid
        log.warning("engine actor %d restarted: %s (pid %d) replaces %s", i, new_url, pid, url)
        return ActorWorker(actor, new_url, pid)

    def stop(self, timeout: float = 10.0) -> None:
        import ray

        if not ray.is_initialized():
            return
        for i, a in enumerate(self.actors):
            try:
                ray.get(a.stop.remote(), timeout=timeout)
            except Exception as e:  # noqa: BLE001 - killed below anyway
                log.debug("engine actor %d stop: %s", i, e)
            ray.kill(a, no_restart=True)
        self.actors = []


class ActorWorker:
    """A restarted engine actor, seen as a worker process by slick/engines/fault.py: its death shows in the
    health checks (its URL stops answering), so ``alive`` is always true here."""

    def __init__(self, actor, url: str, pid: int):
        self.actor, self.url, self.pid = actor, url, pid

    def alive(self) -> bool:
        return True

    def kill(self) -> None:
        import ray

        if ray.is_initialized():
            ray.kill(self.actor, no_restart=True)

    def stop(self, timeout: float = 10.0) -> None:
        self.kill()


def start_engine_actors(cluster, cfg: ConfigView, timeout_s: float, vllm: Optional[dict] = None) -> EngineActors:
    """One engine actor per disaggregated engine bundle of ``cluster.layout``; wait until each serves. With
    ``vllm`` (launch_vllm keyword arguments) each actor hosts a vLLM server instead of slick's engine."""
    import ray

    layout = cluster.layout
    remote = ray.remote(EngineActor if vllm is None else VllmActor)
    kwargs = engine_kwargs(cfg) if vllm is None else vllm
    res = layout.actor_resources()

    def start(e: int):
        bundle = layout.engine_bundles[e]
        return remote.options(num_cpus=res["num_cpus"], num_gpus=res["num_gpus"],
                              scheduling_strategy=cluster.strategy(bundle), name=None,
                              max_restarts=0).remote(cfg.hf_checkpoint, kwargs, cluster.slots_on_node_of(bundle))

    actors = [start(e) for e in range(len(layout.engine_bundles))]
    names = [f"engine actor {e}" for e in range(len(actors))]
    group = EngineActors(actors, [], [], start)
    try:
        t0 = time.perf_counter()
        group.urls = wait_all([a.start.remote(timeout_s) for a in actors], names, timeout_s, "start its server")
        group.pids = wait_all([a.pid.remote() for a in actors], names, timeout_s, "report its pid")
        log.info("%d engine actor(s) serving at %s (%.1fs)", len(actors), group.urls, time.perf_counter() - t0)
    except BaseException:
        group.stop(timeout=2.0)
        raise
    return group

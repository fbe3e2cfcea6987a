"""Trainer ranks as Ray actors, and :class:`RayTrainerGroup`: the interface of an in-process Trainer over them.

Each :class:`TrainerRank` actor sits on its bundle of the run's placement group, sets its torch threads
(``slick.cluster.layout.threads_per_actor``), joins torch.distributed (gloo on CPU, NCCL on GPU) through
``slick.proc.dist.init_process_group`` when there is more than one rank, and builds ``Trainer(cfg)``, which
is then one data-parallel rank. Every Trainer method is collective: the group sends the same full arguments
to every rank (one object in Ray's store) and returns rank 0's answer. Every fan-out waits at most
``timeout_s``; a rank that dies or does not answer ends the call with an error naming the rank and its pid.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Iterator, Optional, Sequence

from slick.config import Config, ConfigView
from slick.algo.batch import TrainBatch
from slick.cluster.actors import RankError, set_actor_threads, wait_all  # noqa: F401 - RankError: raised to callers
from slick.cluster.engine_actor import EngineHost
from slick.engines.client import HttpEngine
from slick.proc.children import rss_bytes
from slick.train.critic import Critic, needs_critic
from slick.train.heads import PolicyHead, ValueHead
from slick.proc.dist import destroy, init_process_group
from slick.ckpt.rng import seed_everything
from slick.train.trainer import Trainer
from slick.weights.transport import make_transport

log = logging.getLogger("slick.cluster")


#: the config groups a rank reads: its trainer's and critic's, and whether the run has a critic (debug)
RANK_GROUPS = tuple(dict.fromkeys(PolicyHead.CONFIG_GROUPS + ValueHead.CONFIG_GROUPS + ("debug",)))


class TrainerRank:
    """The body of one trainer rank's actor (wrapped with ``ray.remote`` by :class:`RayTrainerGroup`)."""

    def __init__(self, cfg: ConfigView, rank: int, world_size: int, slots_on_node: int):
        self.cfg, self.rank, self.world_size = cfg.view(*RANK_GROUPS), rank, world_size
        self.threads = set_actor_threads(slots_on_node)
        self.trainer = self.critic = None
        self.host = None      # the colocated engine (EngineHost) of this rank
        self._transport, self._engines = None, []
        self._loop = asyncio.new_event_loop()   # weight transports' calls (actor methods run on one thread)

    def address(self) -> tuple[str, int]:
        """(IP, free port) for torch.distributed's rendezvous, on this rank's node (asked of rank 0)."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return ip, s.getsockname()[1]

    def setup(self, master_addr: str, master_port: int, timeout_s: float) -> dict:
        """Join the process group (more than one rank), seed, build the Trainer; returns :meth:`state`."""
        import torch

        if self.world_size > 1:
            backend = "nccl" if torch.cuda.is_available() and self.cfg.device in ("auto", "cuda") else "gloo"
            init_process_group(backend, self.rank, self.world_size, master_addr, master_port, timeout_s)
        seed_everything(self.cfg.seed)
        self.trainer = Trainer(self.cfg)

        self.critic = Critic(self.cfg) if needs_critic(self.cfg) else None   # PPO: the same ranks, same group
        return self.state()

    def state(self) -> dict:
        t = self.trainer
        return {"pid": os.getpid(), "version": t.version, "skipped_steps": t.skipped_steps, "has_ref": t.has_ref,
                "device": str(t.device), "dtype": str(t.dtype), "threads": self.threads, "rss_bytes": rss_bytes(),
                "seconds": dict(getattr(self, "call_seconds", {}))}   # the driver's /metrics exports these per rank

    def call(self, method: str, *args, **kwargs):
        """``trainer.method(*args, **kwargs)`` (collective on every rank); returns (result, state).
        ``critic.METHOD`` calls this rank's critic (slick.cluster.critic_group)."""
        target = self.trainer
        if method.startswith("critic."):
            if self.critic is None:
                raise RuntimeError(f"trainer rank {self.rank}: {method} called but this run has no critic")
            target, method = self.critic, method[len("critic."):]
        t0, called = time.perf_counter(), method
        result = getattr(target, method)(*args, **kwargs)
        if method == "named_weights":   # a generator of collectives: every rank walks it to the end
            result = [(n, t.cpu()) for n, t in result]
            result = result if self.rank == 0 else None
        elif self.rank != 0:
            result = None     # every rank computed the same answer; only rank 0's travels back
        self.call_seconds = {**getattr(self, "call_seconds", {}), called: time.perf_counter() - t0}
        return result, self.state()

    def call_packed(self, method: str, packed: tuple):
        """:meth:`call` with ``(args, kwargs)`` in one object (Ray resolves it before the call)."""
        args, kwargs = packed
        return self.call(method, *args, **kwargs)

    def start_engine(self, model_path: str, engine_kwargs: dict, timeout_s: float) -> str:
        """Host this rank's colocated engine server in this process; returns its URL."""
        self.host = EngineHost(model_path, engine_kwargs)
        return self.host.start(timeout_s)

    def send_weights(self, transport: str, engine_urls: list, disk_dir: Optional[str], bucket_bytes: int,
                     timeout_s: float) -> int:
        """Every rank gathers the full weights (collective); then the colocated transport hands them to this
        process's engine (every rank), or rank 0 broadcasts them to ``engine_urls`` (the group is formed once and
        kept between calls). Returns the version sent."""
        if transport not in ("colocated", "broadcast"):
            raise ValueError(f"trainer ranks send weights by colocated or broadcast, not {transport!r} (the driver "
                             f"writes the disk transport's directory from the gathered weights)")
        # LoRA with each rank's own engine: the adapter alone (slick.weights.lora_sync); else the merged weights
        adapter = self.trainer.adapter_payload() if transport == "colocated" else None    # collective
        named = list(self.trainer.named_weights()) if adapter is None else None        # collective
        version = self.trainer.version
        if transport != "colocated" and self.rank != 0:
            return version
        if self._transport is None:
            if transport == "colocated":
                if self.host is None:
                    raise RuntimeError(f"trainer rank {self.rank}: the colocated transport needs this rank's "
                                       f"engine (--colocate)")
                engines = [self.host.engine]
            else:
                engines = [HttpEngine(list(engine_urls), timeout=timeout_s, control_urls=list(engine_urls))]
            import ray

            self._transport = make_transport(transport, disk_dir=disk_dir, bucket_bytes=bucket_bytes,
                                             timeout_s=timeout_s, master_addr=ray.util.get_node_ip_address(),
                                             model_dir=self.cfg.hf_checkpoint)
            self._engines = engines
            self._loop.run_until_complete(self._transport.connect(engines))
        if adapter is not None:
            self._loop.run_until_complete(self._transport.send_adapter(version, adapter))
        else:
            self._loop.run_until_complete(self._transport.send(version, named))
        return version

    def stop(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            try:
                self._loop.run_until_complete(transport.disconnect())
                for e in self._engines:
                    if hasattr(e, "close"):
                        self._loop.run_until_complete(e.close())
            except Exception as e:  # noqa: BLE001 - stopping anyway
                log.warning("trainer rank %d: disconnecting the weight transport: %s", self.rank, e)
        if self.host is not None:
            self.host.stop()
            self.host = None
        try:
            destroy()
        except ImportError:
            pass


class RayTrainerGroup:
    """Trainer ranks on the run's placement group, seen by the loop as one Trainer."""

    remote = True

    def __init__(self, cfg: Config | ConfigView, cluster, timeout_s: float = 1800.0, start_timeout_s: float = 600.0):
        import ray

        cfg = cfg.view(*RANK_GROUPS)   # what the ranks receive (pickled)
        self.cfg, self.cluster, self.timeout_s = cfg, cluster, float(timeout_s)
        layout = cluster.layout
        self.world_size = layout.trainer_ranks
        self.names = [f"trainer rank {r}" for r in range(self.world_size)]
        res = layout.actor_resources()
        remote = ray.remote(TrainerRank)
        self.actors = [remote.options(num_cpus=res["num_cpus"], num_gpus=res["num_gpus"], max_restarts=0,
                                      scheduling_strategy=cluster.strategy(b)).remote(
                           cfg, r, self.world_size, cluster.slots_on_node_of(b))
                       for r, b in enumerate(layout.trainer_bundles)]
        self.pids: list = []
        self.engine_urls: list = []
        self._state: dict = {}
        try:
            t0 = time.perf_counter()
            addr, port = wait_all([self.actors[0].address.remote()], self.names[:1], start_timeout_s,
                                  "start")[0]
            states = wait_all([a.setup.remote(addr, port, self.timeout_s) for a in self.actors], self.names,
                              start_timeout_s, "build its Trainer")
            self.pids = [s["pid"] for s in states]
            self._state = states[0]
            log.info("%d trainer rank(s) ready in %.1fs (pids %s, %d thread(s) each)", self.world_size,
                     time.perf_counter() - t0, self.pids, states[0]["threads"])
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the Trainer interface
    @property
    def version(self) -> int:
        return int(self._state["version"])

    @property
    def skipped_steps(self) -> int:
        return int(self._state["skipped_steps"])

    @property
    def work(self) -> None:
        """The pass under way (the in-process trainer's ``Trainer.work``): not followed across ranks."""
        return None

    @property
    def has_ref(self) -> bool:
        return bool(self._state["has_ref"])

    @property
    def device(self):
        import torch

        return torch.device(self._state["device"])

    @property
    def dtype(self):
        import torch

        return getattr(torch, str(self._state["dtype"]).removeprefix("torch."))

    @property
    def temperature(self) -> float:
        """The ranks' logprob temperature (--rollout-temperature), as ``Trainer.temperature``."""
        return float(self.cfg.rollout_temperature)

    def candidate_logprobs(self, token_ids, candidates):
        """The mismatch probe is not offered by ranks on Ray (None)."""
        return None

    def _fanout(self, method: str, *args, what: Optional[str] = None, **kwargs):
        import ray

        packed = ray.put((args, kwargs))   # one copy in the object store, read by every rank
        refs = [a.call_packed.remote(method, packed) for a in self.actors]
        results = wait_all(refs, self._named(), self.timeout_s, what or method)
        result, self._state = results[0]
        self.rank_states = [st for _, st in results]   # every rank's state (RSS, call seconds) for the metrics
        return result

    def _named(self) -> list:
        return [f"{n} (pid {p})" for n, p in zip(self.names, self.pids)] if self.pids else self.names

    def compute_logprobs(self, samples: Sequence, which: str = "actor"):
        return self._fanout("compute_logprobs", list(samples), which)

    def train_step(self, batch: TrainBatch, objective) -> dict:
        """Every rank gets the whole batch (each trains its share of the samples); rank 0's metrics come back."""
        return self._fanout("train_step", batch, objective)

    def named_weights(self) -> Iterator:
        return iter(self._fanout("named_weights", what="gather its weights"))

    def adapter_payload(self):
        """The LoRA adapter gathered on the ranks (rank 0's copy; ``slick.weights.lora_sync``); None without LoRA."""
        return self._fanout("adapter_payload", what="gather its LoRA adapter")

    def save(self, out_dir) -> None:
        self._fanout("save", str(out_dir), what=f"save a checkpoint into {out_dir}")

    def load(self, in_dir) -> None:
        self._fanout("load", str(in_dir), what=f"load the checkpoint {in_dir}")

    def save_hf_files(self, out_dir) -> None:
        self._fanout("save_hf_files", str(out_dir), what=f"write HF files into {out_dir}")

    # ------------------------------------------------------------------ colocated engines
    def start_colocated_engines(self, engine_kwargs: dict, timeout_s: float) -> list:
        """One engine server inside each rank's process; returns their URLs (rank order)."""
        self.engine_urls = wait_all([a.start_engine.remote(self.cfg.hf_checkpoint, engine_kwargs, timeout_s)
                                     for a in self.actors], self._named(), timeout_s, "start its engine server")
        return self.engine_urls

    async def send_weights(self, sink) -> float:
        """Push the current weights to ``sink``'s engines (a ``slick.train.protocol.WeightSink``); returns the
        seconds. Engines on Ray get them from the ranks themselves (:meth:`send_from_ranks`: broadcast from rank
        0, or colocated by every rank); otherwise (the disk transport, engines the ranks do not reach) the
        gathered weights go through the sink from the driver, as from an in-process trainer."""
        if sink.ranks_reach_engines and sink.transport != "disk":
            return await asyncio.to_thread(self.send_from_ranks, sink.transport, list(sink.worker_urls),
                                           sink.disk_dir, sink.bucket_bytes)
        return await sink.send(self)

    def send_from_ranks(self, transport: str, engine_urls: list, disk_dir: Optional[str] = None,
                        bucket_bytes: int = 512 << 20) -> float:
        """Every rank pushes the current weights to the engines (:meth:`TrainerRank.send_weights`); returns the
        seconds."""
        t0 = time.perf_counter()
        versions = wait_all([a.send_weights.remote(transport, list(engine_urls), disk_dir, bucket_bytes,
                                                   self.timeout_s) for a in self.actors],
                            self._named(), self.timeout_s, f"send its weights ({transport})")
        if len(set(versions)) != 1:
            raise RankError(f"trainer ranks sent different weight versions {versions}")
        return time.perf_counter() - t0

    # ------------------------------------------------------------------ end
    def close(self) -> None:
        """Stop every rank's engine and process group, then kill the actors (idempotent)."""
        import ray

        if not self.actors or not ray.is_initialized():
            self.actors = []
            return
        try:
            ray.wait([a.stop.remote() for a in self.actors], num_returns=len(self.actors), timeout=10.0)
        except Exception as e:  # noqa: BLE001 - the actors are killed below anyway
            log.debug("stopping trainer ranks: %s", e)
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []


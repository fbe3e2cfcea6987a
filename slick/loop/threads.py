"""CPU threads of a run's phases: how the cores are split between rollout and training, in one place.

``slick train`` runs its phases in turn: each gets every core, and on a CPU each thread ends its OpenMP workers
when its phase is over (:attr:`ThreadPolicy.take_turns`, :attr:`ThreadPolicy.releases_workers`,
``slick.loop.omp``). ``slick train-async`` overlaps them: on a CPU they split the cores (:func:`thread_split`),
and when no thread flag is given the trainer takes every core while no request is in flight and its share while
one is (:attr:`ThreadPolicy.share_cores`,
:meth:`ThreadPolicy.train_budget`, asked by the in-process trainer before each micro-batch). The event loop's own
thread (the in-process engine) runs with the rollout share, or with every core while the trainer waits
(:meth:`ThreadPolicy.training`). The training thread starts with the training share (:meth:`ThreadPolicy.train_pool`).
While they share cores, a step of ``slick train-async`` starts once the engine has no request in flight
(``slick.loop.train_async``, ``perf/trainer_yield_time``): the next batch is generated with every core first,
then the step trains with every core while those groups wait for their rewards or tools, the part of a rollout
that needs no core. (A step decides its threads per micro-batch, and one micro-batch is common: starting it
beside the engine's generation left it on its share for the whole step.) Each thread then ends its OpenMP workers
after its phase too, as in ``slick train``. Thread flags split the cores instead.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Optional
from slick.config import Config, ConfigView


def thread_split(cfg: Config | ConfigView, overlap: bool, device_is_cpu: bool,
                 cores: Optional[int] = None) -> tuple[int, int]:
    """(training threads, rollout threads). Phases that take turns (slick train) each get every core; phases that
    overlap on a CPU (slick train-async) split them, training ceil(n/2), so OpenMP teams never oversubscribe.
    --train-num-threads / --rollout-num-threads override either. ``cores``: torch's thread count when not given."""
    cfg = cfg.view("train", "rollout")
    import torch

    cores = torch.get_num_threads() if cores is None else cores
    train = cores if not (overlap and device_is_cpu) else max(1, (cores + 1) // 2)
    train = cfg.train_num_threads or train
    roll = cores if not (overlap and device_is_cpu) else max(1, cores - train)
    return train, cfg.rollout_num_threads or roll


@dataclass(frozen=True)
class ThreadPolicy:
    """How many CPU threads each phase of a run gets (module doc)."""

    cores: int
    train: int            # the training thread's share
    rollout: int          # the event loop's share (the in-process engine)
    take_turns: bool      # phases in turn on a CPU: each thread releases its OpenMP workers after its phase
    share_cores: bool     # overlapping phases on a CPU with no thread flag: the trainer's share follows the engine

    @classmethod
    def for_run(cls, cfg: Config | ConfigView, overlap: bool, device_is_cpu: bool) -> "ThreadPolicy":
        import torch

        cores = torch.get_num_threads()
        train, rollout = thread_split(cfg, overlap, device_is_cpu, cores)
        share = overlap and device_is_cpu and not (cfg.train_num_threads or cfg.rollout_num_threads)
        return cls(cores, train, rollout, take_turns=device_is_cpu and not overlap, share_cores=share)

    @property
    def releases_workers(self) -> bool:
        """Each thread ends its OpenMP workers when its phase is over (``slick.loop.omp``): whenever one thread's
        team takes every core, in turn (:attr:`take_turns`) or while the other waits (:attr:`share_cores`). Two
        teams alive on every core shorten libgomp's spin-wait for both."""
        return self.take_turns or self.share_cores

    def train_budget(self, engine_busy: bool) -> Optional[int]:
        """Threads for the trainer's next micro-batch: its share while a request is in flight, every core while
        none is; None (leave them) unless :attr:`share_cores`."""
        if not self.share_cores:
            return None
        return self.train if engine_busy else self.cores

    def train_pool(self) -> ThreadPoolExecutor:
        """The training thread (one), started with the training share: the event loop never waits for training."""
        import torch

        return ThreadPoolExecutor(1, thread_name_prefix="slick-train", initializer=torch.set_num_threads,
                                  initargs=(self.train,))

    @contextlib.contextmanager
    def training(self) -> Iterator[None]:
        """Around a training phase awaited on the event loop: the engine's share while the trainer runs, every core
        again after (only when sharing cores)."""
        import torch

        if not self.share_cores:
            yield
            return
        torch.set_num_threads(self.rollout)
        try:
            yield
        finally:
            torch.set_num_threads(self.cores)

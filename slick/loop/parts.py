"""The parts of one training run, grouped by the phase that uses them (built by ``slick.loop.build.build``).

* :class:`RolloutParts`: what the rollout and evaluation phases read: prompts, held-out sets, the buffer, the
  reward hub, the engines and the rollout manager.
* :class:`TrainParts`: what the training and weight-sync phases read: the trainer, the critic, the objective, the
  advantage assembly, the thread policy and the training thread, the weight sink, the OPD teacher.
* :class:`RunOutputs`: where the run reports: its directory, metrics, progress bar, rollout store, timeline,
  Prometheus events and endpoint.
* :class:`StepRange`: the steps this process runs.
* :class:`SlimeParts`: slime's hooks the training and evaluation phases call (train-data conversion and
  post-process, the eval function), when set.
* :class:`Processes`: what was started beside this process and must be stopped (engines, trainer ranks, the
  Ray cluster...), filled while the parts are built so that a failed build stops what it started.

``slick.loop.run.Run`` takes them as its attributes (``run.rollout_parts.manager``, ``run.train_parts.trainer``,
``run.outputs.logger``, ``run.steps.start``). The groups are frozen: nothing changes a part after it is built.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Union

from slick.algo.assemble import Advantages
from slick.cluster.ray_cluster import RayCluster
from slick.data.buffer import RolloutBuffer
from slick.data.chats import ChatDataset
from slick.data.dataset import PromptDataset
from slick.data.source import DataSource
from slick.engine.base import Engine
from slick.factory.engines import EngineSet
from slick.loop.slime_data import SlimeTrainData
from slick.loop.slime_eval import SlimeEval
from slick.loop.threads import ThreadPolicy
from slick.loop.weights import EngineWeights
from slick.observe.metrics import MetricsLogger
from slick.observe.progress import Progress
from slick.observe.step_progress import StepWatch
from slick.observe.prometheus import RunEvents, RunExporter
from slick.observe.store import RolloutStore
from slick.reward import RewardHub
from slick.rollout.manager import RolloutManager
from slick.rollout.timeline import Timeline
from slick.train.opd_teacher import EngineTeacher, TrainerTeacher
from slick.train.protocol import Trainer

# --rollout-function-path (or SFT's SftRollout): (cfg, manager, step) -> (groups, metrics)
RolloutFunction = Callable[[Any, Optional[RolloutManager], int], Awaitable[tuple[list, dict]]]
Teacher = Union[TrainerTeacher, EngineTeacher]


@dataclass(frozen=True, eq=False)
class RolloutParts:
    """What the rollout and evaluation phases read (None: not part of this run)."""

    data: Optional[DataSource]                  # the prompts (or SFT's chats); None without --prompt-data
    eval_sets: dict[str, Union[PromptDataset, ChatDataset]]   # --eval-prompt-data, by name
    buffer: RolloutBuffer                       # between rollout and training (the staleness bound)
    rewards: RewardHub
    rollout_fn: Optional[RolloutFunction]       # --rollout-function-path, SFT's rollout
    engines: Optional[EngineSet]                # None: --load-debug-rollout-data, SFT
    engine: Optional[Engine]                    # the one the rollout talks to (train-async: InterruptibleEngine)
    manager: Optional[RolloutManager]           # None without engines


@dataclass(frozen=True, eq=False)
class TrainParts:
    """What the training and weight-sync phases read (None: not part of this run)."""

    trainer: Optional[Trainer]                  # None: --debug-rollout-only
    critic: Optional[Trainer]                   # PPO's value model
    objective: Callable                         # what the trainer minimises (slick/algo/assemble.py)
    advantages: Advantages                      # the run's advantage assembly, built once
    threads: ThreadPolicy                       # the cores of each phase (slick/loop/threads.py)
    pool: ThreadPoolExecutor                    # the training thread: the event loop never waits for training
    weights: Optional[EngineWeights]            # where trainer.send_weights goes (None without engines)
    teacher: Optional[Teacher]                  # --use-opd: the teacher's scorer (slick/train/opd_teacher.py)


@dataclass(frozen=True, eq=False)
class RunOutputs:
    """Where the run reports (None: not asked for)."""

    run_dir: Path
    logger: MetricsLogger                       # RUN_DIR/metrics.jsonl, TensorBoard, wandb
    progress: Progress
    store: Optional[RolloutStore]               # RUN_DIR/rollouts (Parquet)
    timeline: Optional[Timeline]                # generation and waits over time; --trace-file's spans
    events: Optional[RunEvents]                 # --prometheus-port: the counters the parts report into
    exporter: Optional[RunExporter]             # --prometheus-port: the run's /metrics
    step_watch: Optional[StepWatch] = None      # lines inside a long step (tokens generated, micro-batches, ETA)


@dataclass(frozen=True, eq=False)
class SlimeParts:
    """slime's hooks the run's phases call (None: the flag is not set)."""

    train_data: Optional[SlimeTrainData] = None   # --custom-convert-samples-to-train-data-path,
    #                                               --rollout-data-postprocess-path (slick/loop/slime_data.py)
    eval: Optional[SlimeEval] = None              # --eval-function-path (slick/loop/slime_eval.py)


@dataclass(frozen=True)
class StepRange:
    """The rollout steps this process runs: ``range(start, stop)``; ``stop`` is the run's number of steps."""

    start: int                                  # 0, or the step of the checkpoint resumed from
    stop: int


@dataclass(eq=False)
class Processes:
    """What runs beside this thread and must be stopped: filled as each is started, so a failed build stops what
    it started; :meth:`stop` at the end of the run (after :meth:`close_engines` on the event loop)."""

    cluster: Optional[RayCluster] = None        # the Ray cluster, when the run asks for Ray
    trainer: Optional[Trainer] = None           # trainer ranks (Ray actors) or the in-process trainer
    critic: Optional[Trainer] = None
    engines: Optional[EngineSet] = None         # engine processes, workers, router
    teacher: Optional[Teacher] = None           # an engine teacher's client or in-process engine
    exporter: Optional[RunExporter] = None      # the /metrics HTTP server
    engines_closed: bool = False

    def stop(self) -> None:
        """Stop the engines' processes, the trainer ranks and the Ray cluster slick started (idempotent)."""
        if self.exporter is not None:
            self.exporter.close()
        try:
            if self.teacher is not None:
                self.teacher.close_sync()
            if self.engines is not None and not self.engines_closed:
                self.engines_closed = True
                self.engines.close_sync()
        finally:
            try:
                if self.critic is not None:
                    self.critic.close()
                if self.trainer is not None:
                    self.trainer.close()
            finally:
                if self.cluster is not None:
                    cluster, self.cluster = self.cluster, None
                    cluster.stop()

    async def close_engines(self) -> None:
        """Close the engines on the event loop (once; :meth:`stop` then leaves them)."""
        if self.teacher is not None:
            teacher, self.teacher = self.teacher, None
            await teacher.close()
        if self.engines is not None and not self.engines_closed:
            self.engines_closed = True
            await self.engines.close()


@dataclass(frozen=True, eq=False)
class Parts:
    """Everything :func:`slick.loop.build.build` makes for one run, by group."""

    mode: str                                   # "sync" (slick train) or "async" (slick train-async)
    rollout_parts: RolloutParts
    train_parts: TrainParts
    outputs: RunOutputs
    steps: StepRange
    processes: Processes
    slime: SlimeParts = SlimeParts()            # slime's train-data and eval hooks

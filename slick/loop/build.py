"""Every part of one training run, built from a Config with what it needs passed to its constructor.

``build(cfg, mode) -> Components`` is the one place a run's parts are made; ``slick.loop.run.Run`` keeps only the
phases the drivers call. Nothing is changed on a part after it is built: the staleness bound goes to the buffer,
the engine the rollout talks to (slick train-async's interruptible wrapper) to the rollout manager, the Prometheus
hooks to the reward hub and the rollout manager, the thread budget to the trainer (``slick.loop.threads``).

Order: cheap things that can fail on bad input first (run directory, tokenizer, prompts, reward, loss), then the
trainer (Ray cluster and ranks when the run asks for them), then the engines (processes), the rollout manager and
the Prometheus endpoint last. A failure stops what was started (:meth:`Components.stop_processes`).
"""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import yaml

from slick.config import Config
from slick.cluster import start_cluster
from slick.config.auto import allocator_reason, onednn_cache_reason, threads_reason
from slick.configure.validate import async_lead
from slick.data.buffer import RolloutBuffer
from slick.data.checks import check_run_prompts, check_zero_advantages
from slick.data.dataset import PromptDataset
from slick.data.source import DataSource
from slick.factory.engines import make_engines
from slick.factory.teacher import make_teacher
from slick.factory.trainer import make_critic, make_trainer
from slick.config.sft_distill import is_sft
from slick.config.slime import has_checkpoint   # --load of a directory with no checkpoint yet: a fresh start
from slick.loop.sft_inputs import build_sft_inputs, check_teacher
from slick.algo.assemble import Advantages, objective_from_config
from slick.loop.threads import ThreadPolicy
from slick.loop.weights import EngineWeights
from slick.models.tokenizer import load_tokenizer
from slick.observe.metrics import MetricsLogger
from slick.observe.progress import Progress
from slick.observe.prometheus import RunEvents, start_exporter
from slick.observe.store import RolloutStore
from slick.plugins import load_function
from slick.proc.children import ONEDNN_CACHE_ENTRIES, ONEDNN_CACHE_ENV
from slick.reward import RewardHub
from slick.rollout.interrupt import InterruptibleEngine
from slick.rollout.manager import RolloutManager
from slick.rollout.timeline import Timeline
from slick.ckpt.checkpoint import clean_stale_temp, load_checkpoint
from slick.train.critic import with_critic
from slick.proc.memory import find_tcmalloc, release_free_memory, tcmalloc_loaded, tune_cpu_allocator
from slick.train.precision import resolve_device
from slick.ckpt.rng import seed_everything

log = logging.getLogger("slick")
MODES = ("sync", "async")   # slick train (phases in turn) | slick train-async (rollout and training overlap)


@dataclass(eq=False)
class Components:
    """The parts of one run (fields filled in the order :func:`build` makes them; None: not part of this run)."""

    cfg: Any
    mode: str = "sync"
    run_dir: Optional[Path] = None
    tok: Any = None
    data: Optional[DataSource] = None             # None without --prompt-data
    eval_sets: Optional[dict] = None
    buffer: Optional[RolloutBuffer] = None
    events: Optional[RunEvents] = None            # --prometheus-port: the counters the parts report into
    rewards: Optional[RewardHub] = None
    loss_fn: Optional[Callable] = None             # the objective the trainer minimises (slick/algo/assemble.py)
    advantages: Optional[Advantages] = None       # the run's advantage assembly, built once
    rollout_fn: Optional[Callable] = None         # --rollout-function-path
    cluster: Any = None                           # the Ray cluster, when the run asks for Ray
    trainer: Any = None                           # slick.train.protocol.Trainer (None: --debug-rollout-only)
    critic: Any = None                            # PPO's value model
    threads: Optional[ThreadPolicy] = None
    train_pool: Optional[ThreadPoolExecutor] = None
    start_step: int = 0
    num_steps: int = 0
    logger: Optional[MetricsLogger] = None
    progress: Optional[Progress] = None
    store: Any = None                             # RUN_DIR/rollouts (Parquet), or None
    engines: Any = None                           # the EngineSet (None: --load-debug-rollout-data)
    engine: Any = None                            # the engine the rollout talks to (train-async: interruptible)
    manager: Optional[RolloutManager] = None
    timeline: Optional[Timeline] = None           # generation and waits over time; --trace-file's spans
    teacher: Any = None                           # --use-opd: the teacher's scorer (slick/train/opd_teacher.py)
    weights: Optional[EngineWeights] = None       # where trainer.send_weights goes
    exporter: Any = None                          # --prometheus-port: the run's /metrics
    engines_closed: bool = False

    def stop_processes(self) -> None:
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
        """Close the engines on the event loop (once; :meth:`stop_processes` then leaves them)."""
        if self.teacher is not None:
            teacher, self.teacher = self.teacher, None
            await teacher.close()
        if self.engines is not None and not self.engines_closed:
            self.engines_closed = True
            await self.engines.close()


def build(cfg: Config, mode: str = "sync") -> Components:
    """Every part of a run of ``cfg`` for the driver ``mode`` ("sync": slick train, "async": slick train-async).
    On failure, what was started is stopped (no orphan: actors, engine processes, a local Ray cluster)."""
    if mode not in MODES:
        raise ValueError(f"build: mode must be one of {', '.join(MODES)} (got {mode!r})")
    c = Components(cfg, mode)
    try:
        _build_inputs(c)
        _build_trainer(c)
        _build_rollout(c)
    except BaseException:
        c.stop_processes()
        raise
    return c


def staleness_bound(cfg: Config, mode: str) -> int:
    """The buffer's bound, in versions: --max-staleness for slick train; slick train-async's backstop, at the start
    of a step's training, is lead * k (k optimizer steps per rollout, lead from ``async_lead``)."""
    return async_lead(cfg) * cfg.num_steps_per_rollout if mode == "async" else cfg.max_staleness


def _build_inputs(c: Components) -> None:
    """Run directory, tokenizer, prompts, buffer, reward hub, loss: the cheap parts that fail on bad input."""
    cfg = c.cfg
    if resolve_device(cfg.device).type == "cpu":   # before the tokenizer, Ray or torch start threads
        level, line = allocator_reason(tcmalloc_loaded(), find_tcmalloc() is not None,
                                       os.environ.get("SLICK_ALLOCATOR", "auto").strip().lower(), tune_cpu_allocator())
        log.log(level, "%s", line)
        log.info("%s", onednn_cache_reason(os.environ.get(ONEDNN_CACHE_ENV), ONEDNN_CACHE_ENTRIES))
    c.run_dir = Path(cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    c.run_dir.mkdir(parents=True, exist_ok=True)
    # what interrupted atomic writes left behind (checkpoints; disk weight syncs into RUN_DIR/weights):
    # no other writer runs yet
    for d in {Path(cfg.save), c.run_dir} if cfg.save else {c.run_dir}:
        clean_stale_temp(d)
    (c.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    seed_everything(cfg.seed)
    if not (is_sft(cfg) or cfg.opd_only):   # SFT and pure distillation train no estimator's advantage
        check_zero_advantages(cfg)   # a group-relative estimator with groups of one (slick/data/checks.py)
    check_teacher(cfg)   # --use-opd: one tokenizer for teacher and student (slick/loop/sft_inputs.py)
    c.tok = load_tokenizer(cfg.hf_checkpoint)
    if is_sft(cfg):   # chats with loss masks, held-out chats, the SFT rollout (slick/loop/sft_inputs.py)
        build_sft_inputs(c)
    else:
        c.data = DataSource(PromptDataset.from_config(cfg.data, c.tok), cfg.n_samples_per_prompt,
                            shuffle=cfg.rollout_shuffle, seed=cfg.rollout_seed) if cfg.prompt_data else None
        pairs = list(cfg.eval_prompt_data)
        c.eval_sets = {n: PromptDataset.from_config(cfg.data, c.tok, spec=p) for n, p in zip(pairs[::2], pairs[1::2])}
        check_run_prompts(cfg, c.data.dataset if c.data else None, c.eval_sets)   # prompts fit the context
        c.rollout_fn = load_function(cfg.rollout_function_path, "--rollout-function-path")
    c.buffer = RolloutBuffer.from_config(cfg, max_staleness=staleness_bound(cfg, c.mode))
    c.events = RunEvents() if cfg.prometheus_port is not None else None
    c.rewards = RewardHub(cfg, on_scored=c.events.observe_reward if c.events else None)
    c.loss_fn = objective_from_config(cfg)
    c.advantages = Advantages.from_config(cfg)


def _build_trainer(c: Components) -> None:
    """Ray cluster (when asked for), trainer, critic, thread policy, resume, and the run's outputs."""
    cfg, overlap = c.cfg, c.mode == "async"
    c.cluster = start_cluster(cfg)   # None unless the run asks for Ray (slick.cluster.uses_ray)

    def train_budget() -> Optional[int]:   # asked before each micro-batch; the policy and the engine exist by then
        return c.threads.train_budget(c.engine.busy())

    c.trainer = None if cfg.debug_rollout_only else make_trainer(cfg, c.cluster,
                                                                  thread_budget=train_budget if overlap else None)
    c.critic = make_critic(cfg, c.cluster, c.trainer)   # PPO's value model (None otherwise)
    c.threads = ThreadPolicy.for_run(cfg, overlap, c.trainer is None or c.trainer.device.type == "cpu")
    if c.threads.take_turns or c.threads.share_cores or cfg.train_num_threads or cfg.rollout_num_threads:
        log.info("%s", threads_reason(c.threads.cores, c.threads.train, c.threads.rollout, overlap,
                                      bool(cfg.train_num_threads or cfg.rollout_num_threads)))
    torch.set_num_threads(c.threads.rollout)   # this thread runs the event loop and the in-process engine
    c.train_pool = c.threads.train_pool()      # training never blocks the event loop (engine, rewards, HTTP)
    c.start_step = resume(cfg, c.trainer, c.critic, c.data, c.buffer)
    if cfg.num_rollout is not None:
        c.num_steps = cfg.num_rollout
    else:
        c.num_steps = c.data.num_steps(cfg.rollout_batch_size, cfg.num_epoch or 1) if c.data else 1
    old = c.run_dir / "metrics.jsonl"
    if c.start_step == 0 and old.exists():  # a fresh run in a used directory: keep the old curve aside
        old.rename(c.run_dir / f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    c.logger = MetricsLogger(c.run_dir, use_tensorboard=cfg.use_tensorboard, use_wandb=cfg.use_wandb,
                             wandb_project=cfg.wandb_project, wandb_group=cfg.wandb_group, config=cfg.to_dict())
    c.progress = Progress(c.num_steps, enabled=not cfg.no_progress, initial=c.start_step)
    c.store = RolloutStore.from_config(cfg.rollout_store, c.run_dir, c.tok)   # RUN_DIR/rollouts (Parquet)


def _build_rollout(c: Components) -> None:
    """Engines (may start processes), the engine the rollout talks to, the rollout manager, the weight sink and the
    Prometheus endpoint."""
    cfg = c.cfg
    c.engines = None if cfg.load_debug_rollout_data or is_sft(cfg) else make_engines(cfg, c.cluster, c.trainer,
                                                                      weight_dir=EngineWeights.dir_for(c.run_dir))
    if c.engines is not None:
        c.engine = c.engines.engine
        if c.mode == "async":   # weight updates that pause, continue or resubmit the requests in flight
            c.engine = InterruptibleEngine(c.engine, cfg.async_weight_update, cfg.async_timeout)
        c.timeline = Timeline(trace=bool(cfg.trace_file))
        c.manager = RolloutManager(cfg, c.data, c.engine, c.rewards, c.tok, timeline=c.timeline,
                                   on_generated=c.events.observe_generated if c.events else None)
        c.weights = EngineWeights(cfg, c.engines, c.cluster, c.run_dir)
    c.teacher = make_teacher(cfg, c.trainer, c.train_pool)   # --use-opd (slick/factory/teacher.py)
    c.exporter = start_exporter(cfg.logging, c.run_dir, events=c.events, buffer=c.buffer, trainer=c.trainer,
                                engines=c.engines)
    if c.trainer is None or c.trainer.device.type == "cpu":
        release_free_memory()   # what loading the models freed
    if c.threads.share_cores:
        torch.set_num_threads(c.threads.cores)   # the engine's, until the trainer starts


def resume(cfg: Config, trainer, critic, data, buffer) -> int:
    """--load: the trainer (and critic), the data position and the buffer restored; returns the step (0: fresh)."""
    if not cfg.load or not has_checkpoint(cfg.load):   # slime's first run: --load = --save, not there yet
        return 0
    step, state = load_checkpoint(cfg.load, with_critic(trainer, critic))
    if data and state.get("data"):
        data.load_state_dict(state["data"])
    if state.get("buffer"):
        buffer.load_state_dict(state["buffer"])
    log.info("resumed from %s at step %d", cfg.load, step)
    return step

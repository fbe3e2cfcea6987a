"""Every part of one training run, built from a Config with what it needs passed to its constructor.

``build(cfg, mode) -> Parts`` is the one place a run's parts are made, in the groups of ``slick.loop.parts`` (what
the rollout reads, what training reads, the run's outputs, its steps, the processes to stop);
``slick.loop.run.Run`` takes them and offers the phases the drivers call. Nothing is changed on a part after it
is built: the staleness bound goes to the buffer, the engine the rollout talks to (slick train-async's
interruptible wrapper) to the rollout manager, the Prometheus hooks to the reward hub and the rollout manager, the
thread budget to the trainer (``slick.loop.threads``).

Order: cheap things that can fail on bad input first (run directory, tokenizer, prompts, reward, loss), then the
trainer (Ray cluster and ranks when the run asks for them), then the engines (processes), the rollout manager and
the Prometheus endpoint last. A failure stops what was started (:meth:`Processes.stop`).
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Optional

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
from slick.loop.parts import Parts, Processes, RolloutParts, RunOutputs, SlimeParts, StepRange, TrainParts
from slick.loop.sft_inputs import check_teacher, sft_inputs
from slick.loop.slime_data import SlimeTrainData
from slick.loop.slime_eval import SlimeEval
from slick.algo.assemble import Advantages, objective_from_config
from slick.loop.threads import ThreadPolicy
from slick.loop.weights import EngineWeights
from slick.models.tokenizer import load_tokenizer
from slick.observe.metrics import MetricsLogger
from slick.observe.progress import Progress
from slick.observe.step_progress import StepWatch
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


def build(cfg: Config, mode: str = "sync") -> Parts:
    """Every part of a run of ``cfg`` for the driver ``mode`` ("sync": slick train, "async": slick train-async).
    On failure, what was started is stopped (no orphan: actors, engine processes, a local Ray cluster)."""
    if mode not in MODES:
        raise ValueError(f"build: mode must be one of {', '.join(MODES)} (got {mode!r})")
    processes = Processes()
    try:
        return _build(cfg, mode, processes)
    except BaseException:
        processes.stop()
        raise


def staleness_bound(cfg: Config, mode: str) -> int:
    """The buffer's bound, in versions: --max-staleness for slick train; slick train-async's backstop, at the start
    of a step's training, is lead * k (k optimizer steps per rollout, lead from ``async_lead``)."""
    return async_lead(cfg) * cfg.num_steps_per_rollout if mode == "async" else cfg.max_staleness


def _build(cfg: Config, mode: str, processes: Processes) -> Parts:
    """The parts in order (module doc); each process started goes into ``processes`` as soon as it runs."""
    overlap = mode == "async"
    # the inputs: cheap, and they fail on bad input
    run_dir = _start_run_dir(cfg)
    tok = load_tokenizer(cfg.hf_checkpoint)
    # SFT: chats with loss masks, held-out chats, the SFT rollout (slick/loop/sft_inputs.py)
    data, eval_sets, rollout_fn = sft_inputs(cfg, tok) if is_sft(cfg) else _prompt_inputs(cfg, tok)
    buffer = RolloutBuffer.from_config(cfg, max_staleness=staleness_bound(cfg, mode))
    events = RunEvents() if cfg.prometheus_port is not None else None
    rewards = RewardHub(cfg, on_scored=events.observe_reward if events else None)
    objective, advantages = objective_from_config(cfg), Advantages.from_config(cfg)

    # the trainer: Ray cluster (when asked for), trainer, critic, thread policy, resume, and the run's outputs
    cluster = processes.cluster = start_cluster(cfg)   # None unless the run asks for Ray (slick.cluster.uses_ray)

    def train_budget() -> Optional[int]:   # asked before each micro-batch; the policy and the engine exist by then
        return threads.train_budget(engine.busy())

    trainer = processes.trainer = None if cfg.debug_rollout_only else make_trainer(
        cfg, cluster, thread_budget=train_budget if overlap else None)
    critic = processes.critic = make_critic(cfg, cluster, trainer)   # PPO's value model (None otherwise)
    threads = _thread_policy(cfg, overlap, trainer)
    pool = threads.train_pool()      # training never blocks the event loop (engine, rewards, HTTP)
    steps = StepRange(resume(cfg, trainer, critic, data, buffer), _num_steps(cfg, data))
    old = run_dir / "metrics.jsonl"
    if steps.start == 0 and old.exists():  # a fresh run in a used directory: keep the old curve aside
        old.rename(run_dir / f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    logger = MetricsLogger(run_dir, use_tensorboard=cfg.use_tensorboard, use_wandb=cfg.use_wandb,
                           wandb_project=cfg.wandb_project, wandb_group=cfg.wandb_group, config=cfg.to_dict())
    progress = Progress(steps.stop, enabled=not cfg.no_progress, initial=steps.start)
    store = RolloutStore.from_config(cfg.rollout_store, run_dir, tok)   # RUN_DIR/rollouts (Parquet)

    # the rollout: engines (may start processes), the engine the rollout talks to, the rollout manager, the weight
    # sink, the teacher and the Prometheus endpoint
    engines = processes.engines = None if cfg.load_debug_rollout_data or is_sft(cfg) else make_engines(
        cfg, cluster, trainer, weight_dir=EngineWeights.dir_for(run_dir))
    engine = manager = timeline = weights = None
    if engines is not None:
        engine = engines.engine
        if overlap:   # weight updates that pause, continue or resubmit the requests in flight
            engine = InterruptibleEngine(engine, cfg.async_weight_update, cfg.async_timeout)
        timeline = Timeline(trace=bool(cfg.trace_file))
        manager = RolloutManager(cfg, data, engine, rewards, tok, timeline=timeline,
                                 on_generated=events.observe_generated if events else None)
        weights = EngineWeights(cfg, engines, cluster, run_dir)
    teacher = processes.teacher = make_teacher(cfg, trainer, pool)   # --use-opd (slick/factory/teacher.py)
    exporter = processes.exporter = start_exporter(cfg.logging, run_dir, events=events, buffer=buffer,
                                                   trainer=trainer, engines=engines)
    watch = StepWatch(progress.write, _engine_tokens(engines), lambda: trainer.work if trainer is not None else None,
                      cfg.rollout_batch_size * cfg.n_samples_per_prompt, cfg.rollout_max_response_len, steps.stop)
    if trainer is None or trainer.device.type == "cpu":
        release_free_memory()   # what loading the models freed
    if threads.share_cores:
        torch.set_num_threads(threads.cores)   # the engine's, until the trainer starts
    return Parts(
        mode=mode,
        rollout_parts=RolloutParts(data=data, eval_sets=eval_sets, buffer=buffer, rewards=rewards,
                                   rollout_fn=rollout_fn, engines=engines, engine=engine, manager=manager),
        train_parts=TrainParts(trainer=trainer, critic=critic, objective=objective, advantages=advantages,
                               threads=threads, pool=pool, weights=weights, teacher=teacher),
        outputs=RunOutputs(run_dir=run_dir, logger=logger, progress=progress, store=store, timeline=timeline,
                           events=events, exporter=exporter, step_watch=watch),
        steps=steps, processes=processes,
        slime=SlimeParts(train_data=SlimeTrainData.from_config(cfg, tok), eval=SlimeEval.from_config(cfg, tok)))


def _start_run_dir(cfg: Config) -> Path:
    """The allocator's log lines, the run directory (its stale temporaries removed, config.yaml written), the
    seed, and the checks of the estimator and the teacher; returns the run directory."""
    if resolve_device(cfg.device).type == "cpu":   # before the tokenizer, Ray or torch start threads
        level, line = allocator_reason(tcmalloc_loaded(), find_tcmalloc() is not None,
                                       os.environ.get("SLICK_ALLOCATOR", "auto").strip().lower(), tune_cpu_allocator())
        log.log(level, "%s", line)
        log.info("%s", onednn_cache_reason(os.environ.get(ONEDNN_CACHE_ENV), ONEDNN_CACHE_ENTRIES))
    run_dir = Path(cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
    run_dir.mkdir(parents=True, exist_ok=True)
    # what interrupted atomic writes left behind (checkpoints; disk weight syncs into RUN_DIR/weights):
    # no other writer runs yet
    for d in {Path(cfg.save), run_dir} if cfg.save else {run_dir}:
        clean_stale_temp(d)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    seed_everything(cfg.seed)
    if not (is_sft(cfg) or cfg.opd_only):   # SFT and pure distillation train no estimator's advantage
        check_zero_advantages(cfg)   # a group-relative estimator with groups of one (slick/data/checks.py)
    check_teacher(cfg)   # --use-opd: one tokenizer for teacher and student (slick/loop/sft_inputs.py)
    return run_dir


def _prompt_inputs(cfg: Config, tok) -> tuple:
    """(prompts, held-out prompt sets, --rollout-function-path) of an RL run, checked against the context."""
    data = DataSource(PromptDataset.from_config(cfg.data, tok), cfg.n_samples_per_prompt,
                      shuffle=cfg.rollout_shuffle, seed=cfg.rollout_seed) if cfg.prompt_data else None
    pairs = list(cfg.eval_prompt_data)
    eval_sets = {n: PromptDataset.from_config(cfg.data, tok, spec=p) for n, p in zip(pairs[::2], pairs[1::2])}
    check_run_prompts(cfg, data.dataset if data else None, eval_sets)   # prompts fit the context
    return data, eval_sets, load_function(cfg.rollout_function_path, "--rollout-function-path")


def _thread_policy(cfg: Config, overlap: bool, trainer) -> ThreadPolicy:
    """The run's thread policy (logged when it matters); this thread, the event loop's, gets the rollout share."""
    threads = ThreadPolicy.for_run(cfg, overlap, trainer is None or trainer.device.type == "cpu")
    if threads.take_turns or threads.share_cores or cfg.train_num_threads or cfg.rollout_num_threads:
        log.info("%s", threads_reason(threads.cores, threads.train, threads.rollout, overlap,
                                      bool(cfg.train_num_threads or cfg.rollout_num_threads)))
    torch.set_num_threads(threads.rollout)   # this thread runs the event loop and the in-process engine
    return threads


def _num_steps(cfg: Config, data: Optional[DataSource]) -> int:
    """--num-rollout, else the steps of --num-epoch passes over the prompts (1 without prompts)."""
    if cfg.num_rollout is not None:
        return cfg.num_rollout
    return data.num_steps(cfg.rollout_batch_size, cfg.num_epoch or 1) if data else 1


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


def _engine_tokens(engines):
    """``() -> generated tokens so far`` of the in-process engine (None where the engines are elsewhere)."""
    stats = getattr(engines.engine, "stats", None) if engines is not None else None
    return (lambda: stats()["generated_tokens_total"]) if stats is not None else (lambda: None)

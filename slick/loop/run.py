"""A Run: the phases the drivers call, over the parts of one training run (``slick.loop.build``).

``Run(cfg)`` builds the parts with :func:`slick.loop.build.build` (or takes them: ``Run(cfg, parts=...)``) and keeps
their groups (``slick.loop.parts``) as its attributes: ``run.rollout_parts`` (prompts, buffer, rewards, engines,
rollout manager), ``run.train_parts`` (trainer, critic, objective, advantages, threads, weight sink, teacher),
``run.outputs`` (run directory, metrics, progress, store, timeline, Prometheus), ``run.steps`` (the steps to run),
``run.processes`` (what ``close`` stops) and ``run.slime`` (slime's train-data and eval hooks). The phases: start, rollout, train (on the training thread),
sync_weights, evaluate, save, log, close. The loop talks to the trainer only through
``slick.train.protocol.Trainer``: it never asks which implementation it has.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Optional

from slick.config import Config
from slick.algo.batch import TrainBatch
from slick.loop import debug
from slick.config.sft_distill import is_sft
from slick.loop.build import build
from slick.loop.parts import Parts, Processes, RolloutParts, RunOutputs, SlimeParts, StepRange, TrainParts
from slick.loop.sft_inputs import evaluate_sft
from slick.loop.omp import release_openmp_workers
from slick.loop.shaping import shape_for_training
from slick.loop.mismatch import probe_mismatch
from slick.loop.weights import EngineWeights
from slick.loop.step import NonFiniteTrainingError, optimizer_batch_size, train_on_batch
from slick.observe.store import store_step
from slick.observe.trace import trace_path, write_trace
from slick.reward import NonFiniteRewardError
from slick.rollout.eval import evaluate
from slick.ckpt.checkpoint import save_checkpoint, save_hf
from slick.train.critic import with_critic
from slick.weights.check import check_engine_weights, check_tolerance

log = logging.getLogger("slick")


class Run:
    """The phases of one run over its parts. ``overlap``: rollout and training run at the same time (slick
    train-async): the parts are built for it (``build(cfg, "async")``: thread split, staleness bound, the
    interruptible engine). ``parts``: parts built already (then ``overlap`` is theirs)."""

    cfg: Config
    mode: str                       # "sync" or "async": what the parts were built for
    rollout_parts: RolloutParts
    train_parts: TrainParts
    outputs: RunOutputs
    steps: StepRange
    processes: Processes
    slime: SlimeParts               # slime's train-data and eval hooks (slick/loop/slime_data.py, slime_eval.py)
    engine_version: int             # the weight version the engines hold (a replacement engine is brought to it)
    trained_step: int               # the last rollout step trained (0 before any)
    _traced: float                  # when --trace-file was last written (time.monotonic)

    def __init__(self, cfg: Config, overlap: bool = False, parts: Optional[Parts] = None):
        parts = parts if parts is not None else build(cfg, "async" if overlap else "sync")
        self.cfg = cfg
        self.mode = parts.mode
        self.rollout_parts = parts.rollout_parts
        self.train_parts = parts.train_parts
        self.outputs = parts.outputs
        self.steps = parts.steps
        self.processes = parts.processes
        self.slime = parts.slime
        self.engine_version = 0
        self.trained_step = max(self.steps.start - 1, 0)   # the last step trained: slime's eval rollout_id
        self._traced = -1e9

    @property
    def version(self) -> int:
        trainer = self.train_parts.trainer
        return trainer.version if trainer else 0

    async def start(self) -> None:
        """Bring the engines to the trainer's weights (after a resume or a fresh start) and watch them
        (engine faults: docs/engine.md)."""
        engines, manager = self.rollout_parts.engines, self.rollout_parts.manager
        if engines:
            engines.watch(self.cfg, bring_up=self.bring_up, pending=lambda: manager.pending if manager else ())
        if self.steps.start and engines and self.train_parts.trainer:
            await self.sync_weights()
            await self.check_weights()

    async def bring_up(self, url: str) -> int:
        """Load the engines' current weights and version into the (new) engine at ``url``; returns that version.
        The last weight sync's disk directory holds them; before any sync the engines hold --hf-checkpoint."""
        version = self.engine_version
        if version:
            await self.rollout_parts.engines.engine.load_weights_at(
                url, EngineWeights.dir_for(self.outputs.run_dir), version, timeout=float(self.cfg.dist_timeout))
        return version

    async def rollout(self, step: int):
        """Groups of scored samples for ``step`` (loaded, from --rollout-function-path, or generated) and
        their metrics; every path writes --save-debug-rollout-data when set."""
        cfg, parts = self.cfg, self.rollout_parts
        if cfg.load_debug_rollout_data:
            groups = debug.load_rollout(cfg.load_debug_rollout_data, step)
            metrics = {"rollout/raw_reward": _mean(self.train_rewards([s for g in groups for s in g])[0])}
        elif parts.rollout_fn is not None:
            groups, metrics = await parts.rollout_fn(cfg, parts.manager, step)
        else:
            groups, metrics = await parts.manager.generate_rollout(step)
        if cfg.save_debug_rollout_data:
            debug.save_rollout(cfg.save_debug_rollout_data, step, groups)
        return groups, metrics

    def train_rewards(self, samples) -> tuple[list[float], list]:
        """The scalar rewards training uses, and the indices of the samples whose scalar was NaN/inf: those
        get --rm-failure-reward (the hub catches these at scoring; this guards rewards from any other source,
        e.g. --load-debug-rollout-data)."""
        rewards, bad = [], []
        for s in samples:
            try:
                r = self.rollout_parts.rewards.scalar(s)
            except NonFiniteRewardError:
                r = math.nan
            if not math.isfinite(r):
                bad.append(s.index)
                r = float(self.cfg.rm_failure_reward)
            rewards.append(r)
        return rewards, bad

    def train(self, step: int, groups, teacher_logprobs=None) -> dict:
        """One training phase on ``groups``; ``teacher_logprobs`` (--use-opd): the teacher's logprobs of every
        response token (:meth:`score_teacher`)."""
        samples = [s for g in groups for s in g]
        if not samples:
            return {}
        self.trained_step = step
        if self.outputs.exporter is not None:
            self.outputs.exporter.observe_trained(samples, self.train_parts.trainer.version)
        rewards, bad = self.train_rewards(samples)
        if bad:
            log.warning("step %d: %d non-finite reward(s) (sample indices %s) replaced by --rm-failure-reward %s",
                        step, len(bad), bad[:10], self.cfg.rm_failure_reward)
        manager, slime = self.rollout_parts.manager, self.slime.train_data
        postprocess = slime.postprocess_batch if slime is not None and slime.postprocess else None
        post = manager.reward_post if manager is not None else None
        if slime is not None and slime.convert is not None:   # slime's samples-to-train-data (slick/loop/slime_data.py)
            post = slime.convert_samples
        if post is not None:      # slime's --custom-reward-post-process-path: its rewards are the advantages' input
            rewards, post_metrics = post(samples, rewards)
        samples, rewards, shaped = shape_for_training(self.cfg, samples, rewards)   # DAPO: overlong, truncated
        if post is not None:
            shaped.update(post_metrics)
        dump = self.cfg.save_debug_train_data
        debug_logp = self.train_parts.trainer.compute_logprobs(samples, "actor") if dump else None  # an extra pass
        # the trainer's version at each sample's optimizer step (samples are split into global batches in order)
        v0, gbs = self.train_parts.trainer.version, optimizer_batch_size(self.cfg, len(samples))
        batch = TrainBatch.from_samples(samples, rewards, versions=[v0 + i // gbs for i in range(len(samples))])
        if teacher_logprobs is not None:
            batch = batch.with_columns(teacher_logprobs=teacher_logprobs)
        try:
            metrics, batch = train_on_batch(self.cfg, self.train_parts.trainer, batch, self.train_parts.objective,
                                            step, critic=self.train_parts.critic,
                                            advantages=self.train_parts.advantages,
                                            postprocess=postprocess)
        except NonFiniteTrainingError as e:
            if dump:
                debug.save_train_data(dump, step, e.batch, debug_logp)
            raise
        if dump:
            debug.save_train_data(dump, step, batch, debug_logp)
        metrics["train/nonfinite_rewards"] = float(len(bad))
        metrics.update(shaped)
        # the store's steps are 1-based
        metrics.update(store_step(self.outputs.store, step + 1, batch.samples, batch.rewards, batch.versions))
        return metrics

    async def train_off_loop(self, step: int, groups) -> dict:
        """:meth:`train` on the training thread; the event loop keeps serving the engine meanwhile. When the
        phases take turns on a CPU or share its cores, each thread ends its OpenMP workers when its phase is over
        (:attr:`ThreadPolicy.releases_workers`). With --use-opd the teacher scores the samples first
        (:meth:`score_teacher`)."""
        t0 = time.perf_counter()
        teacher, metrics = await self.score_teacher(groups)
        pool = self.train_parts.pool
        if not self.train_parts.threads.releases_workers:
            metrics.update(await asyncio.get_running_loop().run_in_executor(pool, self.train, step, groups, teacher))
        else:
            release_openmp_workers()   # the engine's, on this thread

            def train_in_turn():
                try:
                    return self.train(step, groups, teacher)
                finally:
                    release_openmp_workers()
            metrics.update(await asyncio.get_running_loop().run_in_executor(pool, train_in_turn))
        if self.outputs.timeline is not None:
            self.outputs.timeline.add(f"train step {step + 1}", "trainer", t0, time.perf_counter(),
                                      groups=[g[0].group_index for g in groups if g])
        return metrics

    async def score_teacher(self, groups) -> tuple:
        """--use-opd: the teacher's logprobs of every response token of ``groups`` (slick/train/opd_teacher.py:
        the trainer's frozen forward or a teacher engine) and ``perf/teacher_time``; (None, {}) without a teacher."""
        samples = [s for g in groups for s in g]
        teacher = self.train_parts.teacher
        if teacher is None or not samples or self.cfg.debug_rollout_only:
            return None, {}
        t0 = time.perf_counter()
        logprobs = await teacher.score(samples)
        return logprobs, {"perf/teacher_time": time.perf_counter() - t0}

    async def sync_weights(self) -> dict:
        """Push the trainer's weights to the engines (``trainer.send_weights`` into the run's weight sink,
        slick/loop/weights.py: --weight-transport, kept connected between calls). Returns perf/update_weights_time."""
        if not self.rollout_parts.engines or self.cfg.debug_train_only or self._actor_unchanged():
            return {}
        seconds = await self.train_parts.trainer.send_weights(self.train_parts.weights)
        self.engine_version = self.train_parts.trainer.version
        return {"perf/update_weights_time": seconds}

    async def check_weights(self) -> dict:
        """After a sync, once the engines generate again: their version and a probe's logprobs against the
        trainer's (slick/weights/check.py; LoRA or --weight-check-tol). Raises WeightSyncError."""
        trainer, engines = self.train_parts.trainer, self.rollout_parts.engines
        tol = check_tolerance(self.cfg, trainer.dtype)
        if tol is None or not engines or self.cfg.debug_train_only or self._actor_unchanged():
            return {}
        loop = asyncio.get_running_loop()
        return await check_engine_weights(trainer, engines.engine, tol, lambda samples: loop.run_in_executor(
            self.train_parts.pool, trainer.compute_logprobs, samples))

    async def probe_mismatch(self, step: int, groups) -> dict:
        """KL(engine || trainer) over the whole vocabulary on a few of ``groups``' samples (slick/loop/mismatch.py)
        at rollout step ``step`` (0-based) when it is one of --mismatch-probe-interval's; call it while the engines
        hold the trainer's weights."""
        trainer, engines, pool = self.train_parts.trainer, self.rollout_parts.engines, self.train_parts.pool
        if not engines or self.cfg.debug_train_only or trainer is None or \
                self.engine_version != trainer.version or step % self.cfg.mismatch_probe_interval:
            return {}
        loop, t0 = asyncio.get_running_loop(), time.perf_counter()
        out = await probe_mismatch(engines.engine, trainer, [s for g in groups for s in g],
                                   self.cfg.mismatch_probe_samples, self.cfg.mismatch_probe_top_k,
                                   lambda fn, *a: loop.run_in_executor(pool, fn, *a))
        return {**out, "perf/mismatch_probe_time": time.perf_counter() - t0} if out else out

    def _actor_unchanged(self) -> bool:
        """Critic-only steps (--num-critic-only-steps): the actor has not stepped; the engines hold its weights."""
        return self.train_parts.critic is not None and bool(self.cfg.num_critic_only_steps) and \
            self.train_parts.trainer.version == 0

    async def offload_rollout(self) -> dict:
        """--offload-rollout: free the in-process engine's KV cache and packed weights for the training phase
        (the weight sync after it sends them back). Returns perf/offload_freed_mb."""
        if self._actor_unchanged() or not self.rollout_parts.engines:   # no sync follows (or no engine: SFT)
            return {}
        return {"perf/offload_freed_mb": await self.rollout_parts.engines.engine.release_memory() / 2**20}

    @property
    def evaluates_beside_rollout(self) -> bool:
        """Whether an evaluation may run while the next rollout generates on the same engine (`slick train`
        overlaps them): the built-in rollout without a dynamic-sampling filter, which never aborts the engine's
        other requests (over-sampling aborts every request left when the batch is full), and no slime eval function
        (it is given the data source the rollout draws from)."""
        manager = self.rollout_parts.manager
        return (manager is not None and self.rollout_parts.rollout_fn is None and manager.filter_fn is None
                and not is_sft(self.cfg) and self.slime.eval is None)

    async def evaluate(self) -> dict:
        eval_sets, manager = self.rollout_parts.eval_sets, self.rollout_parts.manager
        if eval_sets and is_sft(self.cfg):   # held-out chats: loss and token accuracy (slick/loop/sft_inputs.py)
            return await asyncio.get_running_loop().run_in_executor(self.train_parts.pool, evaluate_sft,
                                                                    self.train_parts.trainer, eval_sets)
        if not eval_sets or not manager:
            return {}
        if self.slime.eval is not None:   # slime's --eval-function-path (slick/loop/slime_eval.py)
            return await self.slime.eval(manager, self.trained_step)
        return await evaluate(self.cfg, manager, eval_sets)

    def save(self, step: int) -> None:
        """A checkpoint into --save (when set) and the HF export into --save-hf (when set)."""
        cfg, data, trainer = self.cfg, self.rollout_parts.data, self.train_parts.trainer
        if cfg.save:
            state = {"step": step, "data": data.state_dict() if data else None,
                     "buffer": self.rollout_parts.buffer.state_dict()}
            path = save_checkpoint(cfg.save, step, with_critic(trainer, self.train_parts.critic), state,
                                   keep_last=cfg.keep_checkpoints, keep_every=cfg.save_retain_interval)
            self.outputs.progress.write(f"saved checkpoint {path}")
        if cfg.save_hf:
            self.outputs.progress.write(f"wrote HF model {save_hf(cfg.save_hf, trainer)}")

    def watch_step(self, step: int) -> asyncio.Future:
        """A task writing lines inside step ``step`` once it runs long (slick/observe/step_progress.py); the
        driver cancels it when the step is done."""
        watch = self.outputs.step_watch
        return asyncio.ensure_future(watch.watch(step) if watch is not None else asyncio.sleep(0))

    def log(self, metrics: dict, step: int) -> None:
        out = self.outputs
        out.logger.log(metrics, step)
        self.write_trace(every=10.0)
        if out.exporter is not None:
            out.exporter.observe_step(metrics, step)
        out.progress.update(step, metrics)

    def write_trace(self, every: float = 0.0) -> None:
        """--trace-file: write the timeline so far (at most once per ``every`` seconds)."""
        run_dir, timeline = self.outputs.run_dir, self.outputs.timeline
        path = trace_path(self.cfg.trace_file, run_dir)
        if path is None or timeline is None or time.monotonic() - self._traced < every:
            return
        self._traced = time.monotonic()
        write_trace(path, timeline.events(), {"run_dir": str(run_dir)})

    async def close(self) -> None:
        self.write_trace()
        try:
            self.train_parts.pool.shutdown(wait=True)
            self.outputs.progress.close()
            self.outputs.logger.close()
            await self.rollout_parts.rewards.close()
            if self.rollout_parts.manager is not None:   # the agent endpoint (--agent-function-path)
                await self.rollout_parts.manager.close()
            if self.train_parts.weights is not None:
                await self.train_parts.weights.close()
            await self.processes.close_engines()
        finally:
            self.processes.stop()   # the engines' processes, the trainer ranks, the Ray cluster slick started
        engines = self.rollout_parts.engines
        if engines is not None and engines.failure is not None:
            raise engines.failure   # an engine died: this, not the cancellation it caused, ends the run


def _mean(xs):
    return sum(xs) / max(len(xs), 1)

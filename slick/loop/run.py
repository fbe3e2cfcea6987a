"""A Run: every component of one training run, built from a Config, and the phases the driver calls."""
from __future__ import annotations

import asyncio
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from slick.data.buffer import RolloutBuffer
from slick.data.checks import check_run_prompts, check_zero_advantages
from slick.data.dataset import PromptDataset
from slick.data.source import DataSource
from slick.engine.factory import make_engines
from slick.loop import debug
from slick.loop.omp import release_openmp_workers
from slick.loop.step import NonFiniteTrainingError, make_loss_fn, optimizer_batch_size, train_on_samples
from slick.observe.metrics import MetricsLogger
from slick.observe.prometheus import start_exporter
from slick.observe.progress import Progress
from slick.observe.store import RolloutStore, store_step
from slick.plugins import load_function
from slick.reward import NonFiniteRewardError, RewardHub
from slick.rollout.eval import evaluate
from slick.rollout.manager import RolloutManager
from slick.train.memory import release_free_memory, tcmalloc_loaded, tune_cpu_allocator
from slick.train.precision import resolve_device
from slick.train.rng import seed_everything

log = logging.getLogger("slick")


def thread_split(cfg, overlap: bool, device_is_cpu: bool) -> tuple[int, int]:
    """(training threads, rollout threads). Phases that take turns (slick train) each get every core; phases that
    overlap on a CPU (slick train-async) split them, training ceil(n/2), so OpenMP teams never oversubscribe.
    --train-num-threads / --rollout-num-threads override either."""
    import torch

    cores = torch.get_num_threads()
    train = cores if not (overlap and device_is_cpu) else max(1, (cores + 1) // 2)
    train = cfg.train_num_threads or train
    roll = cores if not (overlap and device_is_cpu) else max(1, cores - train)
    return train, cfg.rollout_num_threads or roll


class Run:
    """Every component of one run and the phases the drivers call. ``overlap``: rollout and training run at
    the same time (slick train-async), which changes how CPU threads are split (:func:`thread_split`)."""

    def __init__(self, cfg, overlap: bool = False):
        self.cluster = self.trainer = self.critic = self.engines = None
        self._engines_closed = False
        self.exporter = None        # --prometheus-port (slick/observe/prometheus.py)
        self._transport = None      # the weight transport of the driver-side engines, connected on first use
        try:
            self._build(cfg, overlap)
        except BaseException:
            self._stop_processes()   # no orphan: actors, engine processes and a local Ray cluster end here
            raise

    def _build(self, cfg, overlap: bool) -> None:
        import torch

        from slick.cluster import start_cluster
        from slick.train.critic import make_critic
        from slick.train.factory import make_trainer

        self.cfg = cfg
        if resolve_device(cfg.device).type == "cpu":   # before the tokenizer, Ray or torch start threads
            log.info("CPU allocator: %s", "tcmalloc" if tcmalloc_loaded()
                     else "glibc, tuned" if tune_cpu_allocator() else "glibc")
        self.run_dir = Path(cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        from slick.train.checkpoint import clean_stale_temp

        # what interrupted atomic writes left behind (checkpoints; disk weight syncs into RUN_DIR/weights):
        # no other writer runs yet
        for d in {Path(cfg.save), self.run_dir} if cfg.save else {self.run_dir}:
            clean_stale_temp(d)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        seed_everything(cfg.seed)
        check_zero_advantages(cfg)   # a group-relative estimator with groups of one (slick/data/checks.py)
        # cheap things that can fail on bad input first, then the trainer, then the engines (processes)
        from slick.models.tokenizer import load_tokenizer

        self.tok = load_tokenizer(cfg.hf_checkpoint)
        self.data = DataSource(PromptDataset.from_config(cfg, self.tok), cfg.n_samples_per_prompt,
                               shuffle=cfg.rollout_shuffle, seed=cfg.rollout_seed) if cfg.prompt_data else None
        pairs = list(cfg.eval_prompt_data)
        self.eval_sets = {n: PromptDataset.from_config(cfg, self.tok, spec=p) for n, p in zip(pairs[::2], pairs[1::2])}
        check_run_prompts(cfg, self.data.dataset if self.data else None, self.eval_sets)   # prompts fit the context
        self.buffer = RolloutBuffer.from_config(cfg)
        self.rewards = RewardHub(cfg)
        self.loss_fn = make_loss_fn(cfg)
        self.rollout_fn = load_function(cfg.rollout_function_path, "--rollout-function-path")
        self.cluster = start_cluster(cfg)   # None unless the run asks for Ray (slick.cluster.uses_ray)
        self.trainer = None if cfg.debug_rollout_only else make_trainer(cfg, self.cluster)
        self.critic = make_critic(cfg, self.cluster, self.trainer)   # PPO's value model (None otherwise)
        cpu = self.trainer is None or self.trainer.device.type == "cpu"
        self.cores = torch.get_num_threads()
        self.train_threads, self.rollout_threads = thread_split(cfg, overlap, cpu)
        self._take_turns = cpu and not overlap   # one OpenMP team at a time (slick/loop/omp.py)
        torch.set_num_threads(self.rollout_threads)   # this thread runs the event loop and the in-process engine
        # training runs on its own thread so that the event loop (engine, rewards, HTTP) never waits for it
        self._train_pool = ThreadPoolExecutor(1, thread_name_prefix="slick-train",
                                              initializer=torch.set_num_threads, initargs=(self.train_threads,))
        self.start_step = self._maybe_resume()
        if cfg.num_rollout is not None:
            self.num_steps = cfg.num_rollout
        else:
            self.num_steps = self.data.num_steps(cfg.rollout_batch_size, cfg.num_epoch or 1) if self.data else 1
        old = self.run_dir / "metrics.jsonl"
        if self.start_step == 0 and old.exists():  # a fresh run in a used directory: keep the old curve aside
            old.rename(self.run_dir / f"metrics.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
        self.logger = MetricsLogger(self.run_dir, use_tensorboard=cfg.use_tensorboard, use_wandb=cfg.use_wandb,
                                    wandb_project=cfg.wandb_project, wandb_group=cfg.wandb_group,
                                    config=cfg.to_dict())
        self.progress = Progress(self.num_steps, enabled=not cfg.no_progress, initial=self.start_step)
        self.store = RolloutStore.from_config(cfg, self.run_dir, self.tok)   # RUN_DIR/rollouts (Parquet)
        # last: may start processes
        self.engines = None if cfg.load_debug_rollout_data else make_engines(cfg, self.cluster, self.trainer)
        self.manager = RolloutManager(cfg, self.data, self.engines.engine, self.rewards, self.tok) \
            if self.engines else None
        self.exporter = start_exporter(cfg, self)   # --prometheus-port: the run's /metrics, or None
        if cpu:
            release_free_memory()   # what loading the models freed

    def _stop_processes(self) -> None:
        """Stop the engines' processes, the trainer ranks and the Ray cluster slick started (idempotent)."""
        if self.exporter is not None:
            self.exporter.close()
        try:
            if self.engines and not self._engines_closed:
                self._engines_closed = True
                self.engines.close_sync()
        finally:
            try:
                if hasattr(self.critic, "close"):
                    self.critic.close()
                if hasattr(self.trainer, "close"):
                    self.trainer.close()
            finally:
                if self.cluster is not None:
                    self.cluster.stop()
                    self.cluster = None

    @property
    def version(self) -> int:
        return self.trainer.version if self.trainer else 0

    def _maybe_resume(self) -> int:
        if not self.cfg.load:
            return 0
        from slick.train.checkpoint import load_checkpoint
        from slick.train.critic import with_critic

        step, state = load_checkpoint(self.cfg.load, with_critic(self.trainer, self.critic))
        if self.data and state.get("data"):
            self.data.load_state_dict(state["data"])
        if state.get("buffer"):
            self.buffer.load_state_dict(state["buffer"])
        log.info("resumed from %s at step %d", self.cfg.load, step)
        return step

    async def start(self) -> None:
        """Bring the engines to the trainer's weights (after a resume or a fresh start) and watch them
        (engine faults: docs/engine.md)."""
        self.engine_version = 0     # the weight version the engines hold (a replacement engine is brought to it)
        if self.engines:
            self.engines.watch(self.cfg, bring_up=self.bring_up,
                               pending=lambda: self.manager.pending if self.manager else ())
        if self.start_step and self.engines and self.trainer:
            await self.sync_weights()

    async def bring_up(self, url: str) -> int:
        """Load the engines' current weights and version into the (new) engine at ``url``; returns that version.
        The last weight sync's disk directory holds them; before any sync the engines hold --hf-checkpoint."""
        version = getattr(self, "engine_version", 0)
        if version:
            await self.engines.engine.control(url, "/update_weights_from_disk", {
                "model_path": str(self.run_dir / "weights"), "weight_version": str(version)},
                timeout=float(self.cfg.dist_timeout))
        return version

    async def rollout(self, step: int):
        """Groups of scored samples for ``step`` (loaded, from --rollout-function-path, or generated) and
        their metrics; every path writes --save-debug-rollout-data when set."""
        cfg = self.cfg
        if cfg.load_debug_rollout_data:
            groups = debug.load_rollout(cfg.load_debug_rollout_data, step)
            metrics = {"rollout/raw_reward": _mean(self.train_rewards([s for g in groups for s in g])[0])}
        elif self.rollout_fn is not None:
            groups, metrics = await self.rollout_fn(cfg, self.manager, step)
        else:
            groups, metrics = await self.manager.generate_rollout(step)
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
                r = self.rewards.scalar(s)
            except NonFiniteRewardError:
                r = math.nan
            if not math.isfinite(r):
                bad.append(s.index)
                r = float(self.cfg.rm_failure_reward)
            rewards.append(r)
        return rewards, bad

    def train(self, step: int, groups) -> dict:
        samples = [s for g in groups for s in g]
        if not samples:
            return {}
        if self.exporter is not None:
            self.exporter.observe_trained(samples, self.trainer.version)
        rewards, bad = self.train_rewards(samples)
        if bad:
            log.warning("step %d: %d non-finite reward(s) (sample indices %s) replaced by --rm-failure-reward %s",
                        step, len(bad), bad[:10], self.cfg.rm_failure_reward)
        dump = self.cfg.save_debug_train_data
        debug_logp = self.trainer.compute_logprobs(samples, "actor") if dump else None  # an extra pass
        # the trainer's version at each sample's optimizer step (samples are split into global batches in order)
        v0, gbs = self.trainer.version, optimizer_batch_size(self.cfg, len(samples))
        train_versions = [v0 + i // gbs for i in range(len(samples))]
        try:
            metrics, tensors = train_on_samples(self.cfg, self.trainer, samples, rewards, self.loss_fn, step,
                                                critic=self.critic)
        except NonFiniteTrainingError as e:
            if dump:
                debug.save_train_data(dump, step, samples, rewards, e.tensors, debug_logp, train_versions)
            raise
        if dump:
            debug.save_train_data(dump, step, samples, rewards, tensors, debug_logp, train_versions)
        metrics["train/nonfinite_rewards"] = float(len(bad))
        metrics.update(store_step(self.store, step + 1, samples, rewards, train_versions))  # 1-based, as metrics
        return metrics

    async def train_off_loop(self, step: int, groups) -> dict:
        """:meth:`train` on the training thread; the event loop keeps serving the engine meanwhile. When the
        phases take turns on a CPU, each thread ends its OpenMP workers when its phase is over."""
        if not self._take_turns:
            return await asyncio.get_running_loop().run_in_executor(self._train_pool, self.train, step, groups)
        release_openmp_workers()   # the engine's, on this thread

        def train_in_turn():
            try:
                return self.train(step, groups)
            finally:
                release_openmp_workers()
        return await asyncio.get_running_loop().run_in_executor(self._train_pool, train_in_turn)

    def weight_transport(self) -> str:
        """--weight-transport, with auto resolved for this run's engines (validate_config resolves it too)."""
        name = self.cfg.weight_transport
        if name != "auto":
            return name
        mode = self.engines.sync_mode
        if mode == "ray":
            return "colocated" if self.cluster.layout.colocate else "disk"
        return "colocated" if mode == "tensors" else "disk"

    async def sync_weights(self) -> dict:
        """Push the trainer's weights to the engines through --weight-transport (kept connected between
        calls). On Ray, broadcast is sent by trainer rank 0 and colocated by every rank to the engine in its
        process; disk is written here from the gathered weights (one writer; the engines' hosts must see the
        directory: one machine or a shared file system). Returns perf/update_weights_time."""
        from slick.train.transport import make_transport
        from slick.train.weight_sync import sync_weights

        if not self.engines or self.cfg.debug_train_only or self._actor_unchanged():
            return {}
        cfg, name, disk_dir = self.cfg, self.weight_transport(), str(self.run_dir / "weights")
        bucket = int(cfg.weight_bucket_mb) << 20
        if self.engines.sync_mode == "ray" and name != "disk":   # broadcast from rank 0, or colocated per rank
            seconds = await asyncio.to_thread(self.trainer.send_weights, name, self.engines.worker_urls, disk_dir,
                                              bucket)
        else:
            if self._transport is None:
                self._transport = make_transport(name, disk_dir=disk_dir, bucket_bytes=bucket,
                                                 timeout_s=float(cfg.dist_timeout), model_dir=cfg.hf_checkpoint)
            if self.engines.weights_lock is None:
                seconds = await sync_weights(self.trainer, [self.engines.engine], self._transport)
            else:   # a replacement engine joins before this sync (and gets it) or after it (brought to it)
                async with self.engines.weights_lock:
                    seconds = await sync_weights(self.trainer, [self.engines.engine], self._transport)
        self.engine_version = self.trainer.version
        return {"perf/update_weights_time": seconds}

    def _actor_unchanged(self) -> bool:
        """Critic-only steps (--num-critic-only-steps): the actor has not stepped; the engines hold its weights."""
        return self.critic is not None and bool(self.cfg.num_critic_only_steps) and self.trainer.version == 0

    async def offload_rollout(self) -> dict:
        """--offload-rollout: free the in-process engine's KV cache and packed weights for the training phase
        (the weight sync after it sends them back). Returns perf/offload_freed_mb."""
        if self._actor_unchanged():   # no sync follows this step: the engine keeps its weights
            return {}
        return {"perf/offload_freed_mb": await self.engines.engine.release_memory() / 2**20}

    async def evaluate(self) -> dict:
        if not self.eval_sets or not self.manager:
            return {}
        return await evaluate(self.cfg, self.manager, self.eval_sets)

    def save(self, step: int) -> None:
        """A checkpoint into --save (when set) and the HF export into --save-hf (when set)."""
        from slick.train.checkpoint import save_checkpoint, save_hf
        from slick.train.critic import with_critic

        if self.cfg.save:
            state = {"step": step, "data": self.data.state_dict() if self.data else None,
                     "buffer": self.buffer.state_dict()}
            path = save_checkpoint(self.cfg.save, step, with_critic(self.trainer, self.critic), state, keep_last=self.cfg.keep_checkpoints,
                                   keep_every=self.cfg.save_retain_interval)
            self.progress.write(f"saved checkpoint {path}")
        if self.cfg.save_hf:
            self.progress.write(f"wrote HF model {save_hf(self.cfg.save_hf, self.trainer)}")

    def log(self, metrics: dict, step: int) -> None:
        self.logger.log(metrics, step)
        if self.exporter is not None:
            self.exporter.observe_step(metrics, step)
        self.progress.update(step, metrics)

    async def close(self) -> None:
        try:
            self._train_pool.shutdown(wait=True)
            self.progress.close()
            self.logger.close()
            await self.rewards.close()
            if getattr(self, "manager", None) is not None:   # the agent endpoint (--agent-function-path)
                await self.manager.close()
            if self._transport is not None:
                transport, self._transport = self._transport, None
                await transport.disconnect()
            if self.engines and not self._engines_closed:
                self._engines_closed = True
                await self.engines.close()
        finally:
            self._stop_processes()
        if self.engines is not None and self.engines.failure is not None:
            raise self.engines.failure   # an engine died: this, not the cancellation it caused, ends the run


def _mean(xs):
    return sum(xs) / max(len(xs), 1)

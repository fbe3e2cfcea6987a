"""RolloutManager: prompts -> generated, scored groups of samples, ready for the buffer.

One step: take groups from the DataSource, generate the n samples of every group concurrently,
score each group as soon as its last sample finishes, apply the dynamic-sampling filter, and
(with over-sampling) keep submitting groups until ``rollout_batch_size`` groups passed, then abort
the rest. The engine is anything implementing ``slick.engine.base.Engine``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from typing import Callable, Optional

from slick.config import Config
from slick.plugins import load_function
from slick.rollout.agent import AgentRollout
from slick.rollout.env import ERROR_KEY as ENV_ERROR
from slick.rollout.filters import verdict
from slick.rollout.slime_generate import SlimeGenerate, is_slime_plugin, takes_engine, to_slime
from slick.rollout.slime_hooks import RewardPostProcess, SampleHooks, SlimeRolloutHooks
from slick.rollout.multiturn import MultiTurnRollout, multiturn_metrics, register_tokenizer
from slick.rollout.timeline import Timeline, TimedEngine
from slick.rollout.turn_samples import split_group
from slick.rollout.tools import ToolSet, register_run_tools
from slick.types import SamplingParams, Sample, Status

log = logging.getLogger("slick.rollout")


def sampling_from_config(cfg: Config, *, eval: bool = False, stop_token_ids=None) -> SamplingParams:
    temp = cfg.rollout_temperature
    if eval and cfg.eval_temperature is not None:
        temp = cfg.eval_temperature
    max_len = cfg.rollout_max_response_len
    if eval and cfg.eval_max_response_len is not None:
        max_len = cfg.eval_max_response_len
    stops = list(cfg.rollout_stop_token_ids) + list(stop_token_ids or [])
    top_p = cfg.eval_top_p if eval and cfg.eval_top_p is not None else cfg.rollout_top_p
    return SamplingParams(temperature=temp, top_p=top_p,
                          top_k=-1 if eval else cfg.rollout_top_k, max_new_tokens=max_len,
                          stop=list(cfg.rollout_stop) or None, stop_token_ids=stops or None)


def seeded(sampling: SamplingParams, seed: int, salt: str, sample: Sample) -> SamplingParams:
    """``sampling`` with a seed derived from (seed, salt, sample index, tokens so far), unless it has one."""
    if sampling.seed is not None:
        return sampling
    derived = random.Random(f"slick-sample:{seed}:{salt}:{sample.index}:{len(sample.response_ids)}").getrandbits(63)
    return dataclasses.replace(sampling, seed=derived)


def mask_offpolicy(sample: Sample) -> None:
    """--mask-offpolicy-in-partial-rollout: keep the tokens of a continued sample that older weights sampled,
    but give them loss mask 0 (only the tokens of the sample's newest weight version are trained)."""
    if sample.weight_versions:
        newest = max(sample.weight_versions)
        sample.loss_mask = [m if v == newest else 0 for m, v in zip(sample.loss_mask, sample.weight_versions)]


async def default_generate(args, sample: Sample, sampling: SamplingParams, engine, tokenizer) -> Sample:
    """Generate one response for ``sample`` (continuing any partial response) and decode it."""
    t0 = time.perf_counter()
    if sample.response_ids:  # partial rollout: continue where the aborted generation stopped
        left = sampling.max_new_tokens - len(sample.response_ids)
        sampling = SamplingParams(**{**sampling.__dict__, "max_new_tokens": max(left, 1)})
    gen = await engine.generate(list(sample.prompt_ids) + list(sample.response_ids), sampling)
    sample.apply_generation(gen)
    sample.response = tokenizer.decode(sample.response_ids, skip_special_tokens=True)
    sample.timings["generate"] = sample.timings.get("generate", 0.0) + time.perf_counter() - t0
    return sample


class RolloutManager:
    """Drives the engine and the reward hub for one rollout step at a time. ``engine`` is the engine the rollout
    talks to (slick train-async passes its interruptible wrapper); ``on_generated``, when given, is called with
    each group's newly generated samples (the run's Prometheus events)."""

    def __init__(self, cfg: Config, data_source, engine, reward_hub, tokenizer, *, on_generated=None,
                 timeline: Optional[Timeline] = None):
        self.timeline = timeline or Timeline()   # engine busy time, reward waits (slick/rollout/timeline.py)
        engine = TimedEngine(engine, self.timeline)
        self.cfg, self.data, self.engine, self.rewards, self.tok = cfg, data_source, engine, reward_hub, tokenizer
        self.generate_fn = load_function(cfg.custom_generate_function_path, "--custom-generate-function-path")
        self.filter_fn = load_function(cfg.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path")
        # slime's 3-argument generate functions and slime-importing filters get slime's Sample (slime_generate.py)
        self.slime = SlimeGenerate(self.generate_fn, cfg, lambda: self.engine, tokenizer) \
            if self.generate_fn is not None and not takes_engine(self.generate_fn) else None
        self.filter_slime = self.filter_fn is not None and is_slime_plugin(self.filter_fn)
        self.slime_hooks = SlimeRolloutHooks.from_config(cfg, tokenizer)   # slime's end-of-rollout hooks
        self.reward_post = RewardPostProcess.from_config(cfg, tokenizer)    # slime's reward post-process (training)
        self.sample_hooks = SampleHooks.from_config(cfg, tokenizer)        # slime's per-sample hooks, before rewards
        self.step: Optional[int] = None                                    # the training step being rolled out
        reward_hub.use_tokenizer(tokenizer, bool(cfg.apply_chat_template))   # a slime reward plug-in's sample.prompt is slime's (templated text)
        self.drop_reasons: dict[str, int] = {}
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.sampling = sampling_from_config(cfg, stop_token_ids=eos)
        # --agent-function-path: black-box agents over an OpenAI-compatible endpoint (slick/rollout/agent.py)
        self.agent = AgentRollout.from_config(cfg, lambda: self.engine, tokenizer, reward_hub)
        register_tokenizer(cfg, tokenizer)  # slick.rollout.multiturn.get_tokenizer(args) for custom generates
        self.multiturn = MultiTurnRollout.from_config(cfg, tokenizer, timeline=self.timeline)  # --max-turns > 1 / --tool-path / env
        # the run's tools (--tool-path, --mcp-server/--mcp-url): the multi-turn rollout's, or for an agent its own set
        self.tools = self.multiturn.tools if self.multiturn is not None else \
            ToolSet.from_config(cfg) if self.agent is not None else None
        register_run_tools(cfg, self.tools)   # slick.rollout.tools.run_tools(args) for agents
        self.on_generated = on_generated   # called with each group's newly generated samples
        self.pending: set[int] = set()       # indices of the training samples being generated now

    async def _generate_sample(self, sample: Sample, sampling: SamplingParams, evaluation: bool = False) -> Sample:
        mine = set() if evaluation else {sample.index}   # an evaluation's indices overlap the rollout's
        self.pending |= mine                 # named when an engine dies (slick/factory/engines.py)
        track = None if evaluation or not self.timeline.tracing else f"sample {sample.group_index}.{sample.index}"
        try:
            async with self.timeline.span("sample", track, "generate"):
                return await self._generate_fn(sample, sampling, evaluation)
        finally:
            self.pending -= mine

    async def _generate_fn(self, sample: Sample, sampling: SamplingParams, evaluation: bool) -> Sample:
        if self.slime is not None:
            return await self.slime(sample, sampling, evaluation)
        if self.generate_fn is not None:
            return await self.generate_fn(self.cfg, sample, sampling, self.engine)
        if self.multiturn is not None:
            return await self.multiturn.generate(self.cfg, sample, sampling, self.engine)
        return await default_generate(self.cfg, sample, sampling, self.engine, self.tok)

    async def run_group(self, group: list[Sample], sampling: Optional[SamplingParams] = None,
                        generated: Optional[Callable[[], None]] = None) -> list[Sample]:
        """Generate every unfinished sample of a group concurrently; each is scored as soon as it finishes (a
        group reward, ``--group-rm``, once the group's last sample finishes).

        Without ``sampling`` (a training rollout) each request is seeded from (--rollout-seed, sample index,
        tokens so far), so what a sample draws does not depend on which other requests share the engine.
        A group whose samples all carry rewards already (handed back by an async checkpoint) is not re-scored.
        ``generated`` is called once no sample of the group is generating any more (its rewards may still wait).
        """
        salt = "train" if sampling is None else "eval"
        sampling = sampling or self.sampling
        if self.agent is not None:
            return await self.agent.run_group(group, sampling, lambda s: seeded(sampling, self.cfg.rollout_seed, salt, s),
                                              final_only=salt == "eval")
        todo = [s for s in group if s.status in (Status.PENDING, Status.ABORTED)]
        left = [len(todo)]

        def one_generated() -> None:
            left[0] -= 1
            if left[0] == 0 and generated is not None:
                generated()
        if not todo and generated is not None:
            generated()
        per_sample = self.rewards.per_sample
        await asyncio.gather(*(self._sample_then_score(s, seeded(sampling, self.cfg.rollout_seed, salt, s),
                                                       salt == "eval", per_sample, one_generated) for s in todo))
        if self.on_generated is not None:
            self.on_generated(todo)
        if all(s.status != Status.ABORTED for s in group) and any(s.reward is None for s in group):
            await self._score(group)   # a group reward (--group-rm), or samples handed back unscored
        if salt == "train" and self.multiturn is not None and all(s.status != Status.ABORTED for s in group):
            # episodes under a chat template that rewrites earlier turns: one training sample per turn, sharing
            # the episode's reward (slick/rollout/turn_samples.py); evaluation keeps one sample per episode
            return split_group(group, self.tok)
        return group

    async def _sample_then_score(self, sample: Sample, sampling: SamplingParams, evaluation: bool,
                                 per_sample: bool, generated: Callable[[], None]) -> None:
        """Generate one sample; with a per-sample reward, score it the moment it finishes (its reward wait then
        overlaps the generation of its group's other samples and of other groups)."""
        sample.reward = None
        try:
            await self._generate_sample(sample, sampling, evaluation)
        finally:
            generated()
        if sample.status == Status.ABORTED:   # stopped part-way: continued (and scored) later
            return
        if self.cfg.mask_offpolicy_in_partial_rollout:
            mask_offpolicy(sample)
        if self.sample_hooks is not None:
            await self.sample_hooks(sample, None if evaluation else self.step, evaluation)
        if sample.metadata.get(ENV_ERROR):   # bad environment output: a failed sample, not scored (rollout/env.py)
            sample.reward = float(self.cfg.rm_failure_reward)
            return
        if per_sample:
            await self._score([sample])

    async def _score(self, samples: list[Sample]) -> None:
        samples = [s for s in samples if not s.metadata.get(ENV_ERROR)]   # failed by their environment
        if not samples:
            return
        track = f"sample {samples[0].group_index}.{samples[0].index}" if len(samples) == 1 else \
            f"group {samples[0].group_index}"
        t0 = time.perf_counter()
        async with self.timeline.span("reward", track if self.timeline.tracing else None, "reward"):
            await self.rewards.score_group(samples)
        for s in samples:
            s.timings["reward"] = time.perf_counter() - t0

    def keep(self, group: list[Sample], remaining: int = 1, want: int = 0) -> bool:
        """The dynamic-sampling filter's verdict on a scored group (always True without a filter): a bool or
        slime's DynamicFilterOutput (``slick.rollout.filters.verdict``; ``remaining`` groups kept or in flight,
        this one included, of the ``want`` a step needs). Drop reasons are counted for the step's metrics."""
        if self.filter_fn is None:
            return True
        view = [to_slime(s, self.tok.decode(s.prompt_ids, skip_special_tokens=False)) for s in group] \
            if self.filter_slime else group
        keep, reason = verdict(self.filter_fn(self.cfg, view), remaining=remaining, want=want)
        if not keep and reason:
            self.drop_reasons[str(reason)] = self.drop_reasons.get(str(reason), 0) + 1
        return keep

    async def generate_rollout(self, step: int) -> tuple[list[list[Sample]], dict]:
        """Return ``rollout_batch_size`` finished, scored (and filtered) groups plus rollout metrics."""
        cfg, t0 = self.cfg, time.perf_counter()
        self.step = step
        want = cfg.rollout_batch_size
        per_round = (cfg.over_sampling_batch_size or want) if self.filter_fn else want
        max_rounds = 1 if self.filter_fn is None else 4 * -(-want // per_round) + 4
        kept: list[list[Sample]] = []
        generated: list[list[Sample]] = []   # every finished group, kept or dropped (slime's all_samples)
        pending: set[asyncio.Task] = set()
        dropped = submitted = rounds = 0
        while len(kept) < want:
            if len(kept) + len(pending) < want and rounds < max_rounds:
                pending |= {asyncio.ensure_future(self.run_group(g)) for g in self.data.get_groups(per_round)}
                submitted, rounds = submitted + per_round, rounds + 1
            if not pending:
                break
            try:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:   # the run is ending (an engine died, SIGTERM): stop the groups too
                for task in pending:
                    task.cancel()
                raise
            for task in done:
                group = task.result()
                generated.append(group)
                if self.keep(group, len(kept) + len(pending) + 1, want):
                    kept.append(group)
                else:
                    dropped += 1
        if pending:  # batch is full: stop the leftovers
            await self.engine.abort_all()
            leftovers = await asyncio.gather(*pending)
            # unfinished groups go back to the DataSource (saved in checkpoints): with --partial-rollout they
            # continue where they stopped, otherwise they start over; no prompt is lost
            unfinished = [g for g in leftovers if any(s.status == Status.ABORTED for s in g)]
            if not cfg.partial_rollout:
                for s in (s for g in unfinished for s in g):
                    s.response_ids, s.rollout_logprobs, s.loss_mask, s.weight_versions = [], [], [], []
                    s.response, s.reward, s.status = "", None, Status.PENDING
            self.data.put_back(unfinished)
        if len(kept) < want:
            log.warning("step %d: only %d of %d groups passed the dynamic-sampling filter after %d groups",
                        step, len(kept), want, submitted)
        kept = sorted(kept, key=lambda g: g[0].group_index)[:want]  # batch order independent of timing
        removed = self.slime_hooks.after_rollout(kept, generated, self.data) if self.slime_hooks else None
        metrics = self.rollout_metrics(kept, dropped, time.perf_counter() - t0)
        if removed is not None:
            metrics["rollout/slime_removed_samples"] = float(removed)
        return kept, metrics

    def rollout_metrics(self, groups: list[list[Sample]], dropped: int, seconds: float) -> dict:
        """rollout/* and perf/rollout_* metrics of a batch of groups produced in ``seconds``."""
        samples = [s for g in groups for s in g]
        n = max(len(samples), 1)
        rewards = [self.rewards.scalar(s) for s in samples]
        zero_std = sum(1 for g in groups if len({round(self.rewards.scalar(s), 8) for s in g}) <= 1)
        tokens = sum(len(s.response_ids) for s in samples)
        # sampled by the policy: a multi-turn response's tool and environment tokens (loss_mask 0) are not
        sampled = sum(sum(s.loss_mask) if len(s.loss_mask) == len(s.response_ids) else len(s.response_ids)
                      for s in samples)
        m = {
            "rollout/raw_reward": sum(rewards) / n,
            "rollout/response_len/mean": tokens / n,
            "rollout/truncated_ratio": sum(s.status == Status.TRUNCATED for s in samples) / n,
            "rollout/zero_std/count": zero_std,
            "rollout/filtered_groups": dropped,
            "rollout/generated_tokens": sampled,
            "perf/rollout_time": seconds,
            # time inside reward calls, summed over groups; it overlaps the generation of other groups
            "perf/reward_time": sum(g[0].timings.get("reward", 0.0) for g in groups if g),
            "perf/rollout_tokens_per_sec": sampled / max(seconds, 1e-9),
        }
        m.update({f"rollout/dynamic_filter/drop_{r}": float(n) for r, n in self.drop_reasons.items()})
        self.drop_reasons = {}
        if self.slime is not None:
            m.update(self.slime.metrics())
        m.update(multiturn_metrics(samples))
        m.update(self.rewards.stats())
        if self.agent is not None:
            m.update(self.agent.metrics(samples))
        if self.tools is not None:
            m.update(self.tools.metrics())   # rollout/mcp_* (slick/rollout/mcp.py)
        if self.multiturn is not None and self.multiturn.env_factory is not None:
            m["rollout/env_errors"] = float(sum(bool(s.metadata.get(ENV_ERROR)) for s in samples))
        return m

    async def close(self) -> None:
        """Stop what the manager started (the agent endpoint, the SGLang front of slime plug-ins, the MCP session)."""
        if self.tools is not None:
            register_run_tools(self.cfg, None)
            await self.tools.close()
        if self.agent is not None:
            await self.agent.close()
        if self.slime is not None:
            await self.slime.front.close()

"""The built-in multi-turn rollout (tools and/or an environment), token-in/token-out, plus helpers for
custom generate functions.

One sample is one conversation. Each turn:

1. the engine continues ``prompt_ids + response_ids`` (the exact tokens so far) for at most
   ``min(--max-tokens-per-turn, budget left)`` tokens; the sampled tokens join the response with loss mask 1,
   their logprobs and per-token weight versions (:meth:`slick.types.Sample.apply_generation`);
2. the turn's text is parsed for tool calls (``--tool-parser``); the calls run concurrently
   (:class:`slick.rollout.tools.ToolSet`); without calls an environment (``--environment-path``), when given,
   takes a step on the turn's text; with neither, the sample is finished;
3. the tool results (or the observation) are appended as the chat template's token delta for those messages
   (:class:`slick.chat.delta.ChatDelta`) with loss mask 0, logprob 0.0 and the weight version of the
   turn before; then the next turn starts.

It stops after ``--max-turns`` policy turns, when a turn has no tool call, when the environment says done,
when the response budget is used up (status TRUNCATED), or when the next delta would not leave room for one
policy token within ``--rollout-max-response-len`` (status TRUNCATED). **The response budget counts every
response token, tool and environment tokens included** (they take context and are part of the trained
sequence), so ``len(response_ids) <= --rollout-max-response-len`` always holds. A turn cut by
``--max-tokens-per-turn`` is closed with the template's end-of-turn text (loss mask 0) and parsed like any other
turn; the sample's status is that of its last turn (TRUNCATED when that turn was cut).

**Chat templates that rewrite earlier turns** (Qwen3's drops the reasoning of earlier turns): at start-up the
template is fuzzed once (``slick check-template``'s check) and, when it rewrites, every turn's prompt is the
template's rendering of the conversation so far and each assistant turn becomes its own training sample after
scoring, sharing the episode's reward and advantage (:mod:`slick.rollout.turn_samples`). The choice is logged.

**Partial rollouts.** A turn aborted by the engine returns the sample ABORTED with the tokens so far; the
conversation state lives in ``sample.metadata["multiturn"]`` (JSON), so the next call continues the same turn.
A sample whose response was reset starts over.

``sample.metadata["multiturn"]`` after a rollout: ``messages`` (the conversation as the template saw it,
ending with the last assistant turn), ``turns``, ``tool_calls``, ``tool_errors``, ``tool_time`` (seconds),
``env_reward`` (sum of the environment's rewards, or None). ``sample.response`` is the decoded response
(special tokens skipped) including tool text; rewards that want only the final answer read
``final_answer(sample)``.

**Custom generate functions** keep slime's shape ``async def generate(args, sample, sampling_params, engine)
-> Sample`` and get what they need to stay exact: :func:`get_tokenizer` (the run's tokenizer),
:func:`append_env_tokens` (tokens with loss mask 0), :class:`ChatDelta` (the template delta of new messages)
and ``Sample.apply_generation`` for the engine's output.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
import time
from typing import Optional

from slick.algo.sessions import session_estimator_problem
from slick.chat.delta import ChatDelta, ChatTemplateRewriteError, encode, render, template_supports_tools
from slick.chat.toolcall import get_parser, with_tools_in_system
from slick.config import Config
from slick.models.tokenizer import load_tokenizer
from slick.rollout.env import load_env_factory
from slick.rollout.envs import environment_factory
from slick.rollout.timeline import Timeline
from slick.rollout.tools import ToolSet
from slick.rollout.turn_samples import STATE_KEY, choose_mode, context_ids, episodes, is_episode_head, \
    start_segment, used
from slick.types import SamplingParams, Sample, Status

log = logging.getLogger("slick.rollout")
_TOKENIZERS: dict[str, object] = {}


def register_tokenizer(args: Config, tokenizer) -> None:
    """Make ``tokenizer`` what :func:`get_tokenizer` returns for this run (the rollout manager calls this)."""
    _TOKENIZERS[str(args.hf_checkpoint)] = tokenizer


def get_tokenizer(args: Config):
    """The run's tokenizer, for custom generate functions (``args``: the run's ``Config``, as slick hands it to
    them): the one the rollout uses, else loaded once from ``args.hf_checkpoint`` (a local directory; nothing is
    downloaded)."""
    key = str(args.hf_checkpoint)
    if key not in _TOKENIZERS:
        if not args.hf_checkpoint:
            raise ValueError("get_tokenizer(args): args.hf_checkpoint is not set (--hf-checkpoint)")
        _TOKENIZERS[key] = load_tokenizer(args.hf_checkpoint)
    return _TOKENIZERS[key]


def append_env_tokens(sample: Sample, token_ids: list[int]) -> None:
    """Append tokens the policy did not sample (tool results, observations) to ``sample``'s response:
    loss mask 0, logprob 0.0 (never used in training), weight version of the last token before them."""
    n = len(token_ids)
    version = sample.weight_versions[-1] if sample.weight_versions else 0
    sample.response_ids = list(sample.response_ids) + [int(t) for t in token_ids]
    sample.loss_mask = list(sample.loss_mask) + [0] * n
    sample.rollout_logprobs = list(sample.rollout_logprobs) + [0.0] * n
    sample.weight_versions = list(sample.weight_versions) + [version] * n


def final_answer(sample: Sample) -> str:
    """The content of the last assistant turn of a multi-turn sample (``sample.response`` otherwise)."""
    msgs = (sample.metadata.get(STATE_KEY) or {}).get("messages") or []
    for m in reversed(msgs):
        if m.get("role") == "assistant":
            return m.get("content") or ""
    return sample.response


def enabled(cfg: Config) -> bool:
    """Whether the config selects the built-in multi-turn rollout."""
    return (cfg.max_turns or 1) > 1 or bool(cfg.tool_path) or bool(cfg.environment_path) or bool(cfg.environment)


def _prompt_messages(sample: Sample) -> list[dict]:
    if isinstance(sample.prompt, str):
        return [{"role": "user", "content": sample.prompt}]
    return [dict(m) for m in sample.prompt]


async def _env_step(env, content: str):
    """``env.step(content)``: awaited when async, else on a worker thread, so that a slow synchronous step (a
    simulator, a sleep) does not hold up the event loop, and with it every other episode's decoding."""
    if inspect.iscoroutinefunction(env.step):
        return await env.step(content)
    return await _maybe_await(await asyncio.to_thread(env.step, content))


async def _maybe_await(x):
    return await x if inspect.isawaitable(x) else x


class MultiTurnRollout:
    """The built-in multi-turn generate (module doc). One instance per rollout manager."""

    def __init__(self, cfg: Config, tokenizer, tools: Optional[ToolSet] = None, env_factory=None,
                 timeline: Optional[Timeline] = None):
        self.cfg, self.tok, self.tools, self.env_factory = cfg, tokenizer, tools, env_factory
        self.timeline = timeline or Timeline()   # tool waits, overlapped or exposed (slick/rollout/timeline.py)
        self.parse = get_parser(cfg.tool_parser)
        self.max_turns = max(int(cfg.max_turns or 1), 1)
        self.max_per_turn = cfg.max_tokens_per_turn
        self.tools_in_template = template_supports_tools(tokenizer)
        self._envs: dict[int, object] = {}
        # exact concatenation, or one training sample per turn for a template that rewrites earlier turns
        self.mode = choose_mode(tokenizer)
        self.per_turn = self.mode.per_turn
        self._fell_back = False
        problem = session_estimator_problem(cfg.advantage_estimator, cfg.kl_coef,
                                            bool(cfg.custom_advantage_function_path)) if self.per_turn else ""
        if problem:
            raise ValueError(f"multi-turn rollout: {self.mode.describe()}; {problem} (docs/agents.md)")

    @classmethod
    def from_config(cls, cfg: Config, tokenizer, timeline: Optional[Timeline] = None) -> Optional["MultiTurnRollout"]:
        if not enabled(cfg):
            return None
        env = environment_factory(cfg.environment) or load_env_factory(cfg.environment_path)   # slick/rollout/envs
        return cls(cfg, tokenizer, ToolSet.from_config(cfg), env, timeline)

    # ------------------------------------------------------------------ state
    def _tool_schemas(self, sample: Sample) -> Optional[list]:
        if sample.tools:
            return list(sample.tools)
        return self.tools.schemas() if self.tools is not None else None

    async def _start(self, sample: Sample) -> ChatDelta:
        """Fresh conversation: prompt messages (+ tools section / reset messages), prompt_ids re-rendered when
        they change."""
        msgs = _prompt_messages(sample)
        schemas = self._tool_schemas(sample)
        tools_arg = schemas if (schemas and self.tools_in_template) else None
        changed = False
        if schemas and not self.tools_in_template:
            msgs, changed = with_tools_in_system(msgs, schemas), True
        if self.env_factory is not None:
            env = await _maybe_await(self.env_factory(self.cfg, sample))
            self._envs[sample.index] = env
            extra = await _maybe_await(env.reset(sample)) if hasattr(env, "reset") else None
            if extra:
                msgs += [{"role": "user", "content": extra}] if isinstance(extra, str) else \
                    [dict(extra)] if isinstance(extra, dict) else [dict(m) for m in extra]
                changed = True
        if changed or isinstance(sample.prompt, list) and not sample.prompt_ids:
            text = render(self.tok, msgs, tools_arg, add_generation_prompt=True)
            sample.prompt_ids = encode(self.tok, text)
        else:
            text = render(self.tok, msgs, tools_arg, add_generation_prompt=True)
            if encode(self.tok, text) != list(sample.prompt_ids):
                # the prompt was not rendered with this template (e.g. no --apply-chat-template): use the text the
                # prompt tokens stand for, so the first delta continues from exactly those tokens
                text = self.tok.decode(list(sample.prompt_ids), skip_special_tokens=False)
        delta = ChatDelta(self.tok, msgs, tools_arg, prompt_text=text)
        sample.metadata[STATE_KEY] = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_time": 0.0,
                                      "env_reward": None, "turn_start": None, "tokens": 0,
                                      "tools_arg": tools_arg, **delta.state()}
        return delta

    async def _resume(self, sample: Sample) -> tuple[ChatDelta, dict]:
        st = sample.metadata.get(STATE_KEY)
        fresh = not sample.response_ids or not st or st.get("tokens") != len(sample.response_ids) \
            or (self.env_factory is not None and sample.index not in self._envs)
        if fresh:
            sample.response_ids, sample.rollout_logprobs, sample.loss_mask, sample.weight_versions = [], [], [], []
            delta = await self._start(sample)
            return delta, sample.metadata[STATE_KEY]
        return ChatDelta.from_state(self.tok, st, st.get("tools_arg")), st

    # ------------------------------------------------------------------ the loop
    async def generate(self, args, sample: Sample, sampling: SamplingParams, engine) -> Sample:
        t0 = time.perf_counter()
        delta, st = await self._resume(sample)
        budget = sampling.max_new_tokens
        try:
            await self._loop(sample, sampling, engine, delta, st, budget)
        finally:
            st.update(delta.state())
            st["tokens"] = len(sample.response_ids)
            sample.response = self.tok.decode(sample.response_ids, skip_special_tokens=True)
            sample.timings["generate"] = sample.timings.get("generate", 0.0) + time.perf_counter() - t0
        if sample.status != Status.ABORTED:
            env = self._envs.pop(sample.index, None)
            if env is not None and hasattr(env, "close"):
                await _maybe_await(env.close())
        return sample

    def _turn_sampling(self, sampling: SamplingParams, n: int, sample: Sample) -> SamplingParams:
        seed = sampling.seed
        if seed is not None:  # a fresh seed per turn, still a function of (seed, tokens so far)
            seed = random.Random(f"slick-turn:{seed}:{len(sample.response_ids)}").getrandbits(63)
        return dataclasses.replace(sampling, max_new_tokens=n, seed=seed)

    async def _loop(self, sample, sampling, engine, delta: ChatDelta, st: dict, budget: int) -> None:
        while True:
            if st["turn_start"] is None:
                st["turn_start"] = len(sample.response_ids)
                st["turns"] += 1
            in_turn = len(sample.response_ids) - st["turn_start"]
            n = budget - used(sample, st)   # len(response_ids) unless turns have prompts of their own
            if self.max_per_turn:
                n = min(n, self.max_per_turn - in_turn)
            if n <= 0:
                sample.status = Status.TRUNCATED
                return
            gen = await engine.generate(context_ids(sample, st), self._turn_sampling(sampling, n, sample))
            sample.apply_generation(gen)
            if sample.status == Status.ABORTED:
                return
            content = delta.add_policy_turn(sample.response_ids[st["turn_start"]:])
            st["turn_start"] = None
            # a turn cut by --max-tokens-per-turn is closed by the template's end-of-turn text and the
            # conversation goes on; a cut by the total budget ends the sample (TRUNCATED)
            if sample.status == Status.FAILED or used(sample, st) >= budget or st["turns"] >= self.max_turns:
                return
            track = f"sample {sample.group_index}.{sample.index}" if self.timeline.tracing else None
            async with self.timeline.span("tool", track, "tool"):   # other episodes generate meanwhile
                messages = await self._answer(sample, content, st)
            if not messages:
                return
            if not self.per_turn:
                try:
                    ids = delta.append(messages)
                except ChatTemplateRewriteError as e:   # a rewrite the start-up check did not meet
                    if not self._fell_back:
                        self._fell_back = True
                        log.warning("multi-turn rollout: %s; this episode's next turn becomes a training sample of "
                                    "its own (logged once)", e)
                else:
                    if used(sample, st) + len(ids) >= budget:
                        sample.status = Status.TRUNCATED
                        return
                    append_env_tokens(sample, ids)
                    continue
            if not self._next_prompt(sample, st, delta, messages, budget):
                return

    def _next_prompt(self, sample: Sample, st: dict, delta: ChatDelta, messages: list[dict], budget: int) -> bool:
        """The next turn's prompt rendered afresh from the whole conversation, opening a segment (a training
        sample of its own, slick/rollout/turn_samples.py); False (TRUNCATED) when it leaves no room for a token."""
        ids = encode(self.tok, delta.restart(messages))
        if len(ids) - len(sample.prompt_ids) >= budget:
            sample.status = Status.TRUNCATED
            return False
        start_segment(sample, st, ids)
        return True

    async def _answer(self, sample: Sample, content: str, st: dict) -> list[dict]:
        """Messages answering the policy's turn: tool results, else the environment's observation; [] ends."""
        calls = self.parse(content) if self.tools is not None else []
        if calls:
            t0 = time.perf_counter()
            results = await self.tools.run_all(calls)
            st["tool_time"] += time.perf_counter() - t0
            st["tool_calls"] += len(results)
            st["tool_errors"] += sum(r.error for r in results)
            return [r.message() for r in results]
        env = self._envs.get(sample.index)
        if env is None:
            return []
        obs, reward, done = await _env_step(env, content)
        if reward is not None:
            st["env_reward"] = (st["env_reward"] or 0.0) + float(reward)
            per_turn = st.setdefault("env_turn_rewards", [])   # by policy turn: slick.rollout.env.env_turn_rewards
            per_turn += [0.0] * (st["turns"] - len(per_turn))
            per_turn[st["turns"] - 1] += float(reward)
        if done or obs is None:
            return []
        role = getattr(env, "observation_role", "user")
        if isinstance(obs, str):
            return [{"role": role, "content": obs}]
        return [dict(obs)] if isinstance(obs, dict) else [dict(m) for m in obs]


def multiturn_metrics(samples) -> dict:
    """rollout/turns/mean, rollout/tool_calls/mean, rollout/tool_errors, rollout/tool_time of multi-turn samples
    ({} when none is multi-turn)."""
    states = [s.metadata.get(STATE_KEY) for s in samples
              if isinstance(s.metadata.get(STATE_KEY), dict) and is_episode_head(s)]   # an episode counts once
    if not states:
        return {}
    n = len(states)
    m = {"rollout/turns/mean": sum(st["turns"] for st in states) / n,
         "rollout/tool_calls/mean": sum(st["tool_calls"] for st in states) / n,
         "rollout/tool_errors": sum(st["tool_errors"] for st in states),
         "rollout/tool_time": sum(st["tool_time"] for st in states)}
    eps, total = episodes(samples)
    if total > eps:   # some episode became one training sample per turn (slick/rollout/turn_samples.py)
        m["rollout/turn_samples/mean"] = total / eps
    return m

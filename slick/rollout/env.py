"""Environments for multi-turn rollouts: a game or a simulator plugs in without writing a generate loop.

``--environment-path pkg.mod:MyEnv`` names a factory called once per sample as ``make(args, sample)`` (a class
works: ``MyEnv(args, sample)``); sync or async. The object it returns implements :class:`Environment`:

- ``reset(sample) -> None | str | dict | list[dict]``: called before the first turn. Messages it returns join
  the prompt (a string is a user message) and the prompt tokens are rendered again from the chat template.
- ``step(policy_message: str) -> (observation, reward, done)``: called with the content of each policy turn
  that made no tool call. ``observation`` is a string (a message with role ``observation_role``, default
  ``"user"``), a message dict or a list of them, or None; ``reward`` a float or None (summed into
  ``sample.metadata["multiturn"]["env_reward"]``); ``done`` ends the sample.
- optional ``close()``, called when the sample finishes; optional attribute ``observation_role``.

Every method may be ``async``. The observation is appended with the same token-delta machinery as tool results
(loss mask 0, earlier turns never re-tokenized: ``slick.chat.delta``). With ``--tool-path`` as well,
a turn with tool calls gets tool results and a turn without one goes to the environment.

The environment's reward becomes the sample's reward with ``--custom-rm-path slick.rollout.env.env_reward``
(0.0 when the environment gave none). An environment lives in memory: a sample aborted by a partial rollout
continues with the same object; after a restart from a checkpoint its conversation starts over.

**Bad environment output fails the sample, never the run** (:class:`GuardedEnv`): a factory, ``reset`` or
``step`` that raises, a ``step`` that does not return ``(observation, reward, done)``, an observation that is not
None, a string, a message dict with string ``role`` and ``content`` or a list of them, a reward that is not None or
a finite number (NaN, inf, text), a ``done`` that is not a bool. The episode ends there; the sample keeps its
tokens with loss mask 0 (nothing of it is trained), gets status FAILED, reward ``--rm-failure-reward`` (not
scored) and ``sample.metadata["env_error"]`` naming the cause; the rollout counts it in ``rollout/env_errors``.
A ``close`` that raises is logged.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
from numbers import Real
from typing import Any, Optional, Protocol, runtime_checkable

from slick.plugins import load_function
from slick.types import Status

log = logging.getLogger("slick.rollout")
ERROR_KEY = "env_error"


@runtime_checkable
class Environment(Protocol):
    def reset(self, sample) -> Any: ...

    def step(self, policy_message: str) -> tuple[Any, Optional[float], bool]: ...


def load_env_factory(path: Optional[str]):
    """The ``--environment-path`` factory wrapped so that its environments are :class:`GuardedEnv`, or None when
    unset (errors name the flag, at start-up)."""
    factory = load_function(path, "--environment-path")
    return None if factory is None else guard_factory(factory)


def guard_factory(factory):
    """``factory(args, sample)`` (sync or async) made to return :class:`GuardedEnv` environments: a factory that
    raises fails its sample (``--environment`` adapters use it too: slick/rollout/envs/)."""

    async def make(args, sample):
        try:
            env = factory(args, sample)
            if inspect.isawaitable(env):
                env = await env
        except Exception as e:  # noqa: BLE001 - a user's factory may raise anything: the sample fails
            return GuardedEnv(None, sample, f"environment factory raised {type(e).__name__}: {e}")
        return GuardedEnv(env, sample)
    return make


def observation_problem(obs: Any) -> Optional[str]:
    """Why ``obs`` is not an observation (None, a string, a message dict or a list of them), or None."""
    if obs is None or isinstance(obs, str):
        return None
    msgs = obs if isinstance(obs, list) else [obs]
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return (f"observation must be None, a string, a message dict with string role and content, or a list "
                    f"of them; got {type(obs).__name__}: {str(obs)[:80]!r}")
    return None


def step_problem(out: Any) -> Optional[str]:
    """Why ``out`` is not ``(observation, reward, done)`` with a usable observation, a finite reward or None and
    a bool ``done``, or None."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        return f"step must return (observation, reward, done), got {type(out).__name__}: {str(out)[:80]!r}"
    obs, reward, done = out
    problem = observation_problem(obs)
    if problem:
        return problem
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, Real)
                               or not math.isfinite(float(reward))):
        return f"reward must be None or a finite number, got {type(reward).__name__}: {str(reward)[:80]!r}"
    if not isinstance(done, bool) and type(done).__name__ != "bool_":   # numpy's bool too
        return f"done must be a bool, got {type(done).__name__}: {str(done)[:80]!r}"
    return None


class GuardedEnv:
    """An environment whose failures fail its sample (module doc) instead of the rollout."""

    def __init__(self, env: Any, sample, error: Optional[str] = None):
        self.env, self.sample = env, sample
        self.observation_role = getattr(env, "observation_role", "user")
        if error:
            self._fail(error)

    def _fail(self, error: str) -> None:
        s = self.sample
        if s.metadata.get(ERROR_KEY):
            return
        s.metadata[ERROR_KEY] = error
        s.loss_mask = [0] * len(s.loss_mask)
        s.status = Status.FAILED
        log.warning("sample %s: %s; the sample fails (rollout/env_errors)", getattr(s, "index", "?"), error)

    @property
    def failed(self) -> bool:
        return bool(self.sample.metadata.get(ERROR_KEY))

    async def reset(self, sample) -> Any:
        if self.failed or not hasattr(self.env, "reset"):
            return None
        try:
            out = await _call(self.env.reset, sample, thread=False)
        except Exception as e:  # noqa: BLE001
            self._fail(f"environment reset raised {type(e).__name__}: {e}")
            return None
        problem = observation_problem(out)
        if problem:
            self._fail(f"environment reset: {problem}")
            return None
        return out

    async def step(self, policy_message: str):
        if self.failed:
            return None, None, True
        try:
            out = await _call(self.env.step, policy_message)
        except Exception as e:  # noqa: BLE001
            self._fail(f"environment step raised {type(e).__name__}: {e}")
            return None, None, True
        problem = step_problem(out)
        if problem:
            self._fail(f"environment {problem}")
            return None, None, True
        obs, reward, done = out
        return obs, (None if reward is None else float(reward)), bool(done)

    async def close(self) -> None:
        if self.env is not None and hasattr(self.env, "close"):
            try:
                await _call(self.env.close, thread=False)
            except Exception as e:  # noqa: BLE001 - the sample is finished already
                log.warning("environment close raised %s: %s", type(e).__name__, e)
        # the loop ends on a failed step without a status of its own: keep the failure
        if self.failed:
            self.sample.status = Status.FAILED
            self.sample.loss_mask = [0] * len(self.sample.loss_mask)


async def _call(fn, *args, thread: bool = True):
    """``fn(*args)``, awaited when async; a sync ``step`` runs on a worker thread (a slow simulator must not hold
    the event loop), a sync ``reset`` or ``close`` here."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    out = await asyncio.to_thread(fn, *args) if thread else fn(*args)
    return await out if inspect.isawaitable(out) else out


def env_reward(args, sample) -> float:
    """A ``--custom-rm-path``: the sum of the rewards the environment returned for ``sample``."""
    st = sample.metadata.get("multiturn") or {}
    return float(st.get("env_reward") or 0.0)


def env_turn_rewards(args, sample) -> list:
    """A ``--custom-rm-path`` giving one reward per policy turn (turn-level credit, slick/algo/turns.py): what the
    environment returned after each turn (0.0 for a turn it gave none, e.g. the last turn of --max-turns)."""
    st = sample.metadata.get("multiturn") or {}
    per_turn = list(st.get("env_turn_rewards") or [])
    turns = max(int(st.get("turns") or 0), 1)
    return per_turn + [0.0] * (turns - len(per_turn))


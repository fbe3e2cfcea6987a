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
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, runtime_checkable

from slick.plugins import load_function


@runtime_checkable
class Environment(Protocol):
    def reset(self, sample) -> Any: ...

    def step(self, policy_message: str) -> tuple[Any, Optional[float], bool]: ...


def load_env_factory(path: Optional[str]):
    """The ``--environment-path`` factory, or None when unset (errors name the flag, at start-up)."""
    return load_function(path, "--environment-path")


def env_reward(args, sample) -> float:
    """A ``--custom-rm-path``: the sum of the rewards the environment returned for ``sample``."""
    st = sample.metadata.get("multiturn") or {}
    return float(st.get("env_reward") or 0.0)

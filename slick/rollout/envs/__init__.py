"""Environments users already have, run through slick's token-exact multi-turn rollout (docs/agents.md).

``--environment KIND:ID`` names one:

* ``verifiers:ENV_ID`` - a ``verifiers`` (0.4.0) environment: a taskset (and optionally its ``Env``) imported by
  id as verifiers itself does (slick/rollout/envs/verifiers.py);
* ``textarena:GAME`` - a single-player TextArena (0.7.4) game (slick/rollout/envs/textarena.py).

The prompts come from the same environment: ``--prompt-data KIND:ID[?size=N&seed=S]`` (generated rows, the same
in every process; each row names its task or game seed in ``metadata``, so every sample of a group plays the
same task). Each adapter is an environment of :mod:`slick.rollout.env`'s protocol (``reset``/``step``/``close``),
so the policy's tokens are never re-tokenized and the environment's messages become loss-mask-0 observation tokens,
and each is wrapped in :class:`slick.rollout.env.GuardedEnv`: an adapter or game that raises or answers badly fails
its sample (``rollout/env_errors``) instead of the run.
"""
from __future__ import annotations

from typing import Optional

from slick.rollout.env import guard_factory
from slick.rollout.envs import textarena, verifiers
from slick.rollout.envs.spec import INSTALL, KINDS, EnvSpec, EnvSpecError, is_spec, parse

__all__ = ["INSTALL", "KINDS", "EnvSpec", "EnvSpecError", "check", "environment_factory", "is_spec", "parse",
           "prompt_rows"]


def _module(kind: str):
    return {"verifiers": verifiers, "textarena": textarena}[kind]


def check(text: str) -> EnvSpec:
    """Parse ``text`` and check that the package is installed and the id exists (start-up); ``EnvSpecError``."""
    spec = parse(text)
    _module(spec.kind).check(spec)
    return spec


def prompt_rows(text: str) -> tuple[list, list]:
    """(rows, where) of a ``--prompt-data KIND:ID[?...]`` (slick.data.dataset's row shape)."""
    spec = parse(text)
    return _module(spec.kind).prompt_rows(spec)


def environment_factory(text: Optional[str]):
    """The guarded ``make(args, sample)`` of ``--environment`` (None when unset)."""
    if not text:
        return None
    spec = parse(text)
    return guard_factory(_module(spec.kind).factory(spec))

"""``--prompt-data verifiers:ENV_ID[?size=N&seed=S]`` / ``textarena:GAME[?size=N&seed=S]``: the prompts of an
environment users bring, generated the same in every process (slick/rollout/envs/, docs/agents.md)."""
from __future__ import annotations

from slick.rollout import envs

__all__ = ["is_spec", "load_rows"]


def is_spec(text: str) -> bool:
    return envs.is_spec(text)


def load_rows(spec: str) -> tuple[list, list]:
    """(rows, where) in :func:`slick.data.dataset.load_prompt_rows`'s shape; ``ValueError`` for a bad spec, a
    package that is missing or an id that does not load."""
    return envs.prompt_rows(spec)

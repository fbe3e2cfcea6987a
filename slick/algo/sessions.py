"""Advantages for episodes that became several training samples (docs/agents.md).

An agent session (``--agent-function-path``) whose calls do not extend one another yields several samples, and so
does a multi-turn episode of the built-in rollout under a chat template that rewrites earlier turns (one sample
per assistant turn, ``slick.rollout.turn_samples``); the estimator then sees one sample per session (its last, so
groups keep ``--n-samples-per-prompt`` members) and every sample of the session gets that session's advantage on
its own loss-masked tokens. The rollout marks each sample with its session under ``sample.metadata[SESSION_KEY]``;
the advantage assembly (``slick.algo.assemble``) calls :func:`split_sessions`, :func:`check_session_estimator`,
the estimator on the heads, and :func:`spread_session_advantages`.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

SESSION_KEY = "agent_session"   # sample.metadata key: {"id": session id, "calls": calls in the session}
OUTCOME_ESTIMATORS = ("grpo", "gspo", "rloo", "reinforce_plus_plus_baseline")


def split_sessions(samples: Sequence) -> Optional[list[list[int]]]:
    """Positions of the samples of each agent session, in batch order, when some session yielded several samples
    (``None`` when every sample stands alone: then nothing changes for training)."""
    order: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        sid = (s.metadata.get(SESSION_KEY) or {}).get("id") or f"sample-{i}"
        order.setdefault(sid, []).append(i)
    return None if all(len(v) == 1 for v in order.values()) else list(order.values())


def session_estimator_problem(estimator: str, kl_coef: float, custom: bool) -> str:
    """What keeps the advantage settings from giving one advantage per session ("" when nothing does): only
    outcome-level estimators (:data:`OUTCOME_ESTIMATORS`) without ``--kl-coef`` or
    ``--custom-advantage-function-path`` do."""
    if estimator not in OUTCOME_ESTIMATORS or kl_coef or custom:
        return (f"one advantage per session needs --advantage-estimator {'/'.join(OUTCOME_ESTIMATORS)} without "
                f"--kl-coef or a custom advantage function (got {estimator})")
    return ""


def check_session_estimator(sessions: list[list[int]], estimator: str, kl_coef: float, custom: bool) -> None:
    """Raise, naming the flags, when the estimator cannot give one advantage per session
    (:func:`session_estimator_problem`)."""
    problem = session_estimator_problem(estimator, kl_coef, custom)
    if problem:
        raise ValueError(
            f"{sum(len(v) > 1 for v in sessions)} agent session(s) or multi-turn episode(s) became several training "
            f"samples each (an agent whose calls do not extend one another, or a chat template that rewrites earlier "
            f"turns; docs/agents.md): {problem}")


def session_heads(sessions: list[list[int]]) -> list[int]:
    """The position of each session's last sample: the one the estimator sees."""
    return [v[-1] for v in sessions]


def spread_session_advantages(sessions: list[list[int]], head_advantages: Sequence, loss_masks: Sequence) -> list:
    """Per sample, its session's advantage (the first non-zero value of the head's advantages) on its own
    loss-masked tokens."""
    out: list = [None] * len(loss_masks)
    for members, adv in zip(sessions, head_advantages):
        nz = adv[adv != 0]
        value = float(nz[0]) if len(nz) else 0.0
        for i in members:
            out[i] = value * torch.tensor(loss_masks[i], dtype=torch.float32)
    return out

"""Turn-level rewards and credit: one reward per policy turn, discounted returns, group-relative advantages per
turn, and each turn's advantage on that turn's tokens (docs/agents.md, Turn-level rewards).

A multi-turn sample's response is its policy turns' sampled tokens (loss mask 1) with the tool results and
environment observations between them (loss mask 0); turn ``t`` is the ``t``-th maximal run of mask-1 tokens
(:func:`turn_spans`). A reward function may return one reward per turn (a list, kept as the dict reward
``{"reward": sum, "turn_rewards": [...]}``, :data:`TURN_REWARDS`); a scalar reward counts as the last turn's.

For an episode with turn rewards ``r_0..r_{n-1}`` and ``--turn-gamma`` g::

    G_t = r_t + g * G_{t+1}            (G_{n-1} = r_{n-1})

GRPO's normalisation over the ``--n-samples-per-prompt`` episodes of a prompt (``--turn-advantage-norm``):

* ``episode``: every turn's return against the group's episode returns ``G_0``:
  ``A_{i,t} = (G_{i,t} - mean_j G_{j,0}) / (std_j G_{j,0} + 1e-6)``. With only a final reward and g = 1 every
  ``G_{i,t}`` is the episode's reward and this is GRPO exactly.
* ``turn``: turn ``t``'s return against the returns at the same position of the group's episodes that reached it:
  ``A_{i,t} = (G_{i,t} - mean_j G_{j,t}) / (std_j G_{j,t} + 1e-6)`` (a position only one episode reached gets 0).

``std`` is the unbiased estimate (as :mod:`slick.algo.grpo`); ``--disable-grpo-std-normalization`` drops the
division, ``--disable-rewards-normalization`` makes ``A_{i,t} = G_{i,t}``. Every token of turn ``t`` gets
``A_{i,t}``; tool and environment tokens get 0. Pure functions, no torch beyond the final tensors.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

TURN_REWARDS = "turn_rewards"      # key of the per-turn list in a dict reward
NORMS = ("episode", "turn")
STD_EPS = 1e-6
TURN_ESTIMATORS = ("grpo", "gspo")  # group-relative outcome estimators that take per-turn returns


def turn_spans(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each maximal run of mask-1 tokens: the policy turns of a multi-turn response."""
    spans, start = [], None
    for i, m in enumerate(loss_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(loss_mask)))
    return spans


def as_turn_reward(value: Any) -> Any:
    """A reward function's list of per-turn rewards as the dict reward ``{"reward": sum, "turn_rewards": [...]}``
    (anything else unchanged); ``ValueError`` for an empty list."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("a per-turn reward list is empty: give one reward per policy turn")
        rewards = list(value)
        return {"reward": sum(float(r) for r in rewards), TURN_REWARDS: rewards}
    return value


def has_turn_rewards(reward: Any) -> bool:
    return isinstance(reward, dict) and TURN_REWARDS in reward


def rewards_per_turn(reward: Any, scalar: float, n_turns: int, who: str = "the sample") -> list[float]:
    """The per-turn rewards of a sample with ``n_turns`` turns: its ``turn_rewards`` (exactly one per turn, finite
    numbers), else its scalar reward on the last turn."""
    if n_turns == 0:
        return []
    if not has_turn_rewards(reward):
        return [0.0] * (n_turns - 1) + [float(scalar)]
    values = reward[TURN_REWARDS]
    if not isinstance(values, (list, tuple)) or len(values) != n_turns:
        got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
        raise ValueError(f"{who} has {n_turns} policy turn(s) but {got} per-turn rewards; a reward function "
                         f"returning a list gives one reward per turn")
    out = []
    for v in values:
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"{who}: per-turn reward {v!r} is not finite")
        out.append(f)
    return out


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """``G_t = r_t + gamma * G_{t+1}``, last turn first."""
    out, g = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return mean, std


def group_turn_advantages(returns: Sequence[Sequence[float]], norm: str = "episode", divide_by_std: bool = True,
                          ) -> list[list[float]]:
    """Per episode of one group, per turn: the normalised return (module doc). ``returns[i][t]`` is ``G_{i,t}``."""
    if norm not in NORMS:
        raise ValueError(f"--turn-advantage-norm must be one of {NORMS}, got {norm!r}")
    out: list[list[float]] = []
    if norm == "episode":
        firsts = [g[0] for g in returns if len(g)]
        if not firsts:
            return [[] for _ in returns]
        mean, std = _mean_std(firsts)
        if len(firsts) == 1:
            return [[0.0] * len(g) for g in returns]
        for g in returns:
            out.append([(x - mean) / (std + STD_EPS) if divide_by_std else x - mean for x in g])
        return out
    width = max((len(g) for g in returns), default=0)
    stats = []
    for t in range(width):
        col = [g[t] for g in returns if len(g) > t]
        stats.append((len(col),) + _mean_std(col))
    for g in returns:
        row = []
        for t, x in enumerate(g):
            n, mean, std = stats[t]
            if n == 1:
                row.append(0.0)
            else:
                row.append((x - mean) / (std + STD_EPS) if divide_by_std else x - mean)
        out.append(row)
    return out


def turn_advantages(rewards: Sequence[Any], scalars: Sequence[float], loss_masks: Sequence[Sequence[int]],
                    group_size: int, gamma: float = 1.0, norm: str = "episode", divide_by_std: bool = True,
                    normalize_rewards: bool = True, names: Optional[Sequence[str]] = None) -> list[torch.Tensor]:
    """One advantage tensor per sample (one value per response token): turn ``t``'s normalised discounted return on
    the tokens of turn ``t``, 0 elsewhere. ``rewards``: each sample's reward (a dict with ``turn_rewards``, or
    anything else: then ``scalars[i]`` is the last turn's reward); samples ordered group by group."""
    n = len(loss_masks)
    if group_size < 1 or n % group_size:
        raise ValueError(f"turn advantages: {n} samples are not whole groups of {group_size}")
    spans = [turn_spans(m) for m in loss_masks]
    returns = [discounted_returns(rewards_per_turn(r, s, len(sp), names[i] if names else f"sample {i}"), gamma)
               for i, (r, s, sp) in enumerate(zip(rewards, scalars, spans))]
    per_turn: list[list[float]] = []
    for g0 in range(0, n, group_size):
        block = returns[g0:g0 + group_size]
        per_turn += [list(g) for g in block] if not normalize_rewards else \
            group_turn_advantages(block, norm, divide_by_std)
    out = []
    for adv, sp, mask in zip(per_turn, spans, loss_masks):
        t = torch.zeros(len(mask), dtype=torch.float32)
        for a, (lo, hi) in zip(adv, sp):
            t[lo:hi] = a
        out.append(t)
    return out

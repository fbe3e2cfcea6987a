"""The scalar reward training uses: one pure, torch-free function shared by the reward hub
(:meth:`RewardHub.scalar` and its checks at scoring time) and the dynamic-sampling filters.

A float reward is itself. A dict reward uses its ``reward_key`` entry (``--reward-key``), or its
``"reward"`` entry when no key is set. The value must be a finite number (bool, int, float,
NumPy or 0-d torch scalar); strings and containers are rejected, NaN and infinities too.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional

from slick.reward.errors import NonFiniteRewardError


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) or (hasattr(value, "item") and hasattr(value, "__float__"))


def finite_float(value: Any, what: str = "reward") -> float:
    """``value`` as a finite float.

    Raises :class:`~slick.reward.errors.NonFiniteRewardError` for NaN/inf and ``ValueError`` for
    anything that is not a number; ``what`` names the value in the message.
    """
    if not is_number(value):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}: {str(value)[:80]!r}")
    try:
        out = float(value)
    except (TypeError, ValueError, RuntimeError) as e:   # e.g. a tensor with several elements
        raise ValueError(f"{what} must be a single number, got {type(value).__name__}: {e}") from None
    if not math.isfinite(out):
        raise NonFiniteRewardError(f"{what} is not finite ({out})")
    return out


def scalar_key(reward: dict, reward_key: Optional[str], index: Any = None) -> str:
    """The key of a dict reward that holds its scalar; ``KeyError`` listing the keys when absent."""
    who = f"sample {index}" if index is not None else "the sample"
    key = reward_key or ("reward" if "reward" in reward else None)
    if key is None:
        raise KeyError(f"{who} has a dict reward with keys {sorted(map(str, reward))}; "
                       f"set --reward-key to choose the scalar")
    if key not in reward:
        raise KeyError(f"--reward-key {key!r} not in the dict reward of {who} "
                       f"(keys: {sorted(map(str, reward))})")
    return key


def scalar_reward(reward: Any, reward_key: Optional[str] = None, index: Any = None) -> float:
    """The finite float training uses for ``reward`` (a number or a dict; see the module docstring).

    ``index`` (the sample's index) only goes into error messages. Raises ``ValueError`` for an
    unscored sample (``None``), a non-numeric value or a non-finite one
    (:class:`~slick.reward.errors.NonFiniteRewardError`), and ``KeyError`` naming the keys when
    a dict reward lacks the key.
    """
    who = f"sample {index}" if index is not None else "the sample"
    if reward is None:
        raise ValueError(f"{who} has no reward yet (score it with RewardHub.score_group)")
    if isinstance(reward, dict):
        key = scalar_key(reward, reward_key, index)
        return finite_float(reward[key], f"dict reward field {key!r} of {who}")
    return finite_float(reward, f"reward of {who}")


def nonfinite_fields(reward: dict) -> dict:
    """The numeric entries of a dict reward that are NaN or infinite (``{key: float}``)."""
    out = {}
    for k, v in reward.items():
        if isinstance(v, bool) or not is_number(v):
            continue
        try:
            f = float(v)
        except (TypeError, ValueError, RuntimeError):
            continue
        if not math.isfinite(f):
            out[k] = f
    return out

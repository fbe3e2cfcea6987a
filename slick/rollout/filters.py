"""Built-in group filters for --dynamic-sampling-filter-path, and how a filter's result is read.

A dynamic-sampling filter has the signature ``filter(args, group: list[Sample]) -> bool``
(True keeps the group), or returns slime's ``DynamicFilterOutput`` (:func:`verdict`). Rewards are already set
on the samples when it is called; their scalar is
read with :func:`slick.reward.scalar.scalar_reward`, the same function the trainer's rewards come
from, so a dict reward means the same number here and in training.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional

from slick.config import Config
from slick.reward.scalar import scalar_reward


def check_reward_nonzero_std(args: Config, group) -> bool:
    """Keep a group only when its rewards are not all equal (it carries a learning signal for GRPO)."""
    key = args.reward_key
    rewards = [scalar_reward(s.reward, key, s.index) for s in group]
    return max(rewards) - min(rewards) > 1e-8


def verdict(result: Any, *, remaining: int, want: int,
            flag: str = "--dynamic-sampling-filter-path") -> tuple[bool, Optional[str]]:
    """(keep the group?, drop reason) from a filter's result: a bool (or a 0-d tensor / NumPy bool), or slime's
    ``DynamicFilterOutput`` (anything with ``keep``; also ``reason`` and ``keep_when_insufficient``). A rejected
    group with ``keep_when_insufficient`` is kept when ``remaining`` (the groups kept or in flight, this one
    included) is at most ``want``: dropping it would need another sampling round."""
    keep = getattr(result, "keep", result)
    if not isinstance(keep, (bool, numbers.Number)) and not hasattr(keep, "item"):
        raise TypeError(f"{flag} returned {type(result).__name__}: expected a bool or an object with .keep "
                        f"(slime's DynamicFilterOutput)")
    if bool(keep):
        return True, None
    if getattr(result, "keep_when_insufficient", False) and remaining <= want:
        return True, None
    return False, getattr(result, "reason", None)

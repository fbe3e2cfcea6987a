"""Built-in group filters for --dynamic-sampling-filter-path.

A dynamic-sampling filter has the signature ``filter(args, group: list[Sample]) -> bool``
(True keeps the group). Rewards are already set on the samples when it is called; their scalar is
read with :func:`slick.reward.scalar.scalar_reward`, the same function the trainer's rewards come
from, so a dict reward means the same number here and in training.
"""
from __future__ import annotations

from slick.reward.scalar import scalar_reward


def check_reward_nonzero_std(args, group) -> bool:
    """Keep a group only when its rewards are not all equal (it carries a learning signal for GRPO)."""
    key = getattr(args, "reward_key", None)
    rewards = [scalar_reward(s.reward, key, s.index) for s in group]
    return max(rewards) - min(rewards) > 1e-8

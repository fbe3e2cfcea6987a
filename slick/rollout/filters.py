"""Built-in group filters for --dynamic-sampling-filter-path.

A dynamic-sampling filter has the signature ``filter(args, group: list[Sample]) -> bool``
(True keeps the group). Rewards are already set on the samples when it is called.
"""
from __future__ import annotations


def _scalar(sample, reward_key=None) -> float:
    r = sample.reward
    if isinstance(r, dict):
        r = r.get(reward_key) if reward_key else next(iter(r.values()))
    return float(r or 0.0)


def check_reward_nonzero_std(args, group) -> bool:
    """Keep a group only when its rewards are not all equal (it carries a learning signal for GRPO)."""
    key = getattr(args, "reward_key", None)
    rewards = [_scalar(s, key) for s in group]
    return max(rewards) - min(rewards) > 1e-8

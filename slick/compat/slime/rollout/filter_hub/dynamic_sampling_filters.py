"""slime's built-in dynamic-sampling filters, by their slime paths.

``check_reward_nonzero_std``: keep a group whose rewards are not all equal (DAPO's dynamic sampling); the drop
reason is ``zero_std_<reward>``. ``check_reward_nonzero_std_with_fallback``: the same, but a rejected group is
kept when dropping it would need another sampling round.
"""
from __future__ import annotations

import statistics

from slick.compat.slime.rollout.filter_hub.base_types import DynamicFilterOutput

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def _reward(args, sample) -> float:
    key = args.reward_key
    r = sample.reward
    if isinstance(r, dict):
        r = r[key] if key else r["reward"]
    return float(r)


def check_reward_nonzero_std(args, samples, **kwargs) -> DynamicFilterOutput:
    rewards = [_reward(args, s) for s in samples]
    keep = len(rewards) > 1 and statistics.stdev(rewards) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(args, samples, **kwargs) -> DynamicFilterOutput:
    out = check_reward_nonzero_std(args, samples, **kwargs)
    out.keep_when_insufficient = True
    return out

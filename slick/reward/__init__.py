"""Reward hub: rule rewards (math, gsm8k, exact, f1, countdown, boxed_<type>), remote reward
models over HTTP, and user functions by dotted path, behind one ``RewardHub`` object.

Each rule reward is a pure ``score(response, label, metadata) -> float`` in its own module
(``slick.reward.math``, ``.gsm8k``, ``.text``, ``.countdown``); see ``docs/rewards.md``.
``scalar_reward`` is the one rule for the float training uses from a (dict) reward.
"""
from slick.reward.errors import LabelError, NonFiniteRewardError
from slick.reward.extract import last_boxed
from slick.reward.hub import RewardHub, check_reward
from slick.reward.registry import builtin_score, get_score_fn, known_types
from slick.reward.scalar import scalar_reward

__all__ = ["LabelError", "NonFiniteRewardError", "RewardHub", "builtin_score", "check_reward",
           "get_score_fn", "known_types", "last_boxed", "scalar_reward"]

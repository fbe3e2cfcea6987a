"""REINFORCE++ and REINFORCE++-baseline advantages.

REINFORCE++ (``reinforce_plus_plus``):

1. per-token reward ``-kl_coef * (old_logprobs - ref_logprobs)`` (k1) on every
   masked token, plus the sample's scalar reward at its last masked token;
2. discounted returns with ``gamma`` backwards over the masked tokens;
3. advantages = returns whitened over all masked tokens of the batch
   (``(x - mean) / sqrt(var + 1e-8)``, population variance).

REINFORCE++-baseline (``reinforce_plus_plus_baseline``): the group mean reward
is subtracted from each sample's reward first, then the same three steps.

Both return ``(advantages, returns)`` where returns are the un-whitened
discounted returns. ``inputs.cfg`` (:class:`AlgoParams`) fields read: ``kl_coef``, ``gamma``.
"""
from __future__ import annotations

from torch import Tensor

from .inputs import AdvantageInputs, AdvantageOutputs
from .returns import discounted_returns, kl_token_rewards
from .utils import check_groups, masked_whiten


def _reinforce(rewards: Tensor, inputs: AdvantageInputs, who: str) -> AdvantageOutputs:
    mask, params = inputs.mask.float(), inputs.params(who)
    token_r = kl_token_rewards(rewards, mask, float(params.kl_coef), inputs.old_logprobs, inputs.ref_logprobs)
    ret = discounted_returns(token_r, mask, float(params.gamma))
    return AdvantageOutputs(masked_whiten(ret, mask), ret)


def reinforce_plus_plus(inputs: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE++ advantages [B, T] (whitened) and returns [B, T] (discounted)."""
    grouped = check_groups(inputs.rewards, inputs.mask, inputs.group_size)
    return _reinforce(grouped.reshape(-1), inputs, "reinforce_plus_plus")


def reinforce_plus_plus_baseline(inputs: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE++ with the group mean reward subtracted first (whitened advantages, raw returns)."""
    grouped = check_groups(inputs.rewards, inputs.mask, inputs.group_size)
    centered = (grouped - grouped.mean(dim=-1, keepdim=True)).reshape(-1)
    return _reinforce(centered, inputs, "reinforce_plus_plus_baseline")

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
discounted returns. ``cfg`` attributes read: ``kl_coef`` (0), ``gamma`` (1.0).
"""
from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from .returns import discounted_returns, kl_token_rewards
from .utils import check_groups, masked_whiten, opt


def _reinforce(rewards: Tensor, mask: Tensor, cfg: Any, old_logprobs, ref_logprobs) -> tuple[Tensor, Tensor]:
    mask = mask.float()
    token_r = kl_token_rewards(rewards, mask, float(opt(cfg, "kl_coef", 0.0)), old_logprobs, ref_logprobs)
    ret = discounted_returns(token_r, mask, float(opt(cfg, "gamma", 1.0)))
    return masked_whiten(ret, mask), ret


def reinforce_plus_plus(
    rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    cfg: Any = None,
    old_logprobs: Optional[Tensor] = None,
    ref_logprobs: Optional[Tensor] = None,
    values: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ advantages [B, T] (whitened) and returns [B, T] (discounted)."""
    grouped = check_groups(rewards, mask, group_size)
    return _reinforce(grouped.reshape(-1), mask, cfg, old_logprobs, ref_logprobs)


def reinforce_plus_plus_baseline(
    rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    cfg: Any = None,
    old_logprobs: Optional[Tensor] = None,
    ref_logprobs: Optional[Tensor] = None,
    values: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with the group mean reward subtracted first (whitened advantages, raw returns)."""
    grouped = check_groups(rewards, mask, group_size)
    centered = (grouped - grouped.mean(dim=-1, keepdim=True)).reshape(-1)
    return _reinforce(centered, mask, cfg, old_logprobs, ref_logprobs)

"""PPO advantages: GAE from a critic's values.

Token rewards are ``-kl_coef * (old_logprobs - ref_logprobs)`` (k1) on each
masked token plus the scalar reward at the last masked token; advantages come
from GAE with ``gamma`` and ``lambd`` over the masked tokens (see
``returns.gae``); returns = advantages + values on masked tokens (0 elsewhere).
Advantages are *not* whitened here: use ``normalize_advantages`` for that
(``--normalize-advantages``). ``values`` [B, T] is required.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import Tensor

from .returns import gae, kl_token_rewards
from .utils import check_groups, opt


def ppo(
    rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    cfg: Any = None,
    old_logprobs: Optional[Tensor] = None,
    ref_logprobs: Optional[Tensor] = None,
    values: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """PPO/GAE advantages [B, T] and returns [B, T] (= advantages + values)."""
    grouped = check_groups(rewards, mask, group_size)
    if values is None:
        raise ValueError("advantage estimator 'ppo' needs values [B, T] from a critic; got values=None")
    if values.shape != mask.shape:
        raise ValueError(f"values shape {tuple(values.shape)} must match mask shape {tuple(mask.shape)}")
    mask = mask.float()
    token_r = kl_token_rewards(
        grouped.reshape(-1), mask, float(opt(cfg, "kl_coef", 0.0)), old_logprobs, ref_logprobs
    )
    adv = gae(token_r, values, mask, float(opt(cfg, "gamma", 1.0)), float(opt(cfg, "lambd", 1.0)))
    returns = (adv + values.detach().float()) * mask
    return adv, returns

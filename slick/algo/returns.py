"""Token-level rewards, discounted returns and GAE over masked tokens.

Shared by REINFORCE++ and PPO. "Over masked tokens" means positions where
``mask`` is 0 (padding, tool/environment tokens) are skipped: they get 0, and
the discount/GAE recursion links each counted token to the *next counted*
token of the same row, as if the skipped positions were not there.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .utils import last_token_index


def kl_token_rewards(
    rewards: Tensor,
    mask: Tensor,
    kl_coef: float,
    old_logprobs: Optional[Tensor],
    ref_logprobs: Optional[Tensor],
) -> Tensor:
    """Per-token reward [B, T]: ``-kl_coef * (old - ref)`` (k1) on every masked token,
    plus the scalar reward ``rewards[b]`` at the last masked token of row ``b``.

    ``old_logprobs``/``ref_logprobs`` may be None only when ``kl_coef == 0``.
    """
    mask = mask.float()
    out = torch.zeros_like(mask)
    if kl_coef != 0.0:
        if old_logprobs is None or ref_logprobs is None:
            raise ValueError(
                f"kl_coef={kl_coef} needs old_logprobs and ref_logprobs [B, T] for the per-token KL penalty"
            )
        if old_logprobs.shape != mask.shape or ref_logprobs.shape != mask.shape:
            raise ValueError(
                f"old_logprobs {tuple(old_logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} "
                f"must match mask {tuple(mask.shape)}"
            )
        out = -kl_coef * (old_logprobs.detach().float() - ref_logprobs.detach().float()) * mask
    last = last_token_index(mask)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out = out.clone()
    out[rows, last[rows]] += rewards.detach().float().to(out.device)[rows]
    return out


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + gamma * G_next`` backwards over the masked tokens of each row; 0 elsewhere."""
    mask = mask.float()
    B, T = mask.shape
    ret = torch.zeros_like(mask)
    running = torch.zeros(B, dtype=mask.dtype, device=mask.device)
    for t in range(T - 1, -1, -1):
        on = mask[:, t] > 0
        running = torch.where(on, token_rewards[:, t] + gamma * running, running)
        ret[:, t] = running * mask[:, t]
    return ret


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lambd: float) -> Tensor:
    """Generalised advantage estimation over masked tokens; 0 outside the mask.

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lambd * A_next``,
    where "next" is the next masked token of the row (``V_next = A_next = 0`` after the last).

    Tokens with mask 0 *inside* a response (tool/environment output in a multi-turn sample) are not
    time steps: their reward and value are ignored, they get advantage 0, and the token before them
    bootstraps from the first counted token after them with one factor of ``gamma`` (and of
    ``gamma * lambd``), exactly as if they had been cut out of the row.
    """
    mask = mask.float()
    values = values.detach().float()
    B, T = mask.shape
    adv = torch.zeros_like(mask)
    next_value = torch.zeros(B, dtype=mask.dtype, device=mask.device)
    next_adv = torch.zeros_like(next_value)
    for t in range(T - 1, -1, -1):
        on = mask[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lambd * next_adv
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
        next_value = torch.where(on, values[:, t], next_value)
        next_adv = torch.where(on, a, next_adv)
    return adv

"""Masked tensor helpers shared by the estimators and losses.

Every function takes a value tensor ``x`` and a ``mask`` of the same shape (or
broadcastable), where ``mask`` is 1.0 on entries that count and 0.0 elsewhere.
Only torch and the standard library are used.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

WHITEN_EPS = 1e-8


def masked_sum(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Sum of ``x * mask`` over ``dim`` (all entries when ``dim`` is None)."""
    prod = x * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is set.

    The count is clamped to at least 1, so an all-zero mask gives 0 (never NaN).
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1.0)


def masked_var(x: Tensor, mask: Tensor) -> Tensor:
    """Population (biased) variance of ``x`` over the masked entries."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask)


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """Whiten ``x`` over all masked entries: ``(x - mean) / sqrt(var + 1e-8)``.

    Mean and (population, i.e. biased) variance are taken over the masked
    entries only; entries outside the mask are returned as 0. With
    ``shift_mean=False`` the mean is added back after scaling.
    """
    mask = mask.to(x.dtype)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return out * mask


def check_groups(rewards: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """Validate shapes and return ``rewards`` as a float tensor of shape [B/group_size, group_size]."""
    rewards = torch.as_tensor(rewards, dtype=torch.float32, device=mask.device)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"mask must be [B, T] with B={rewards.shape[0]} (the number of rewards), got shape {tuple(mask.shape)}"
        )
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if rewards.shape[0] % group_size:
        raise ValueError(
            f"batch of {rewards.shape[0]} samples is not a whole number of groups of group_size={group_size}"
        )
    return rewards.view(-1, group_size)


def broadcast_to_tokens(per_sample: Tensor, mask: Tensor) -> Tensor:
    """Turn a per-sample value [B] into a per-token tensor [B, T], zero outside ``mask``."""
    return per_sample.to(mask.dtype if mask.is_floating_point() else torch.float32).unsqueeze(-1) * mask


def last_token_index(mask: Tensor) -> Tensor:
    """Index of the last set entry of each row of ``mask`` [B, T]; -1 for an empty row."""
    T = mask.shape[-1]
    pos = torch.arange(T, device=mask.device).expand_as(mask)
    return torch.where(mask > 0, pos, torch.full_like(pos, -1)).max(dim=-1).values

"""PPO-style clipped policy loss (clip-higher, dual clip, GSPO) and TIS weights.

Per token, with ratio ``rho`` and advantage ``A``::

    l1 = -A * rho
    l2 = -A * clamp(rho, 1 - eps_clip, 1 + eps_clip_high)     # eps_clip_high defaults to eps_clip
    l  = max(l1, l2)
    dual clip (eps_clip_c = c > 1), only where A < 0:  l = min(l, -A * c)

Token-level (PPO/GRPO): ``rho = exp(logprobs - old_logprobs)``.

Sequence-level (GSPO, ``sequence_level=True``): ``s_i = exp(mean over the
sample's masked tokens of (logprobs - old_logprobs))`` and, per token,
``rho = sg[s_i] * exp(logprobs - sg[logprobs])`` (``sg`` = stop-gradient). The
value of rho is ``s_i`` on every token of the sample, and the gradient of rho
with respect to a token's logprob is ``s_i`` (it flows through each token).

``old_logprobs`` is always treated as a constant (detached).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .correction import truncated_weights

from .utils import masked_mean


def policy_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    eps_clip_c: Optional[float] = None,
    sequence_level: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token ``(loss, clipped indicator, old - new log-ratio)``, each [B, T].

    A token counts as clipped when the loss took a clipped branch: the ratio
    clamp (``l2 > l1``) or the dual clip.
    """
    if not (logprobs.shape == old_logprobs.shape == advantages.shape == mask.shape):
        raise ValueError(
            "policy loss inputs must share one shape [B, T]: "
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)}, "
            f"advantages {tuple(advantages.shape)}, mask {tuple(mask.shape)}"
        )
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(f"eps_clip_c (dual clip) must be > 1, got {eps_clip_c}")
    high = eps_clip if eps_clip_high is None else eps_clip_high
    logprobs = logprobs.float()  # ratios in fp32 even when the model runs in bf16 (gradient still flows)
    mask = mask.to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs.detach().to(logprobs.dtype)
    if sequence_level:
        seq_log_ratio = masked_mean(log_ratio.detach(), mask, dim=-1)  # [B]
        log_ratio = seq_log_ratio.unsqueeze(-1) + logprobs - logprobs.detach()
    ratio = torch.exp(log_ratio)
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + high)
    loss = torch.maximum(l1, l2)
    clipped = l2 > l1
    if eps_clip_c is not None:
        l3 = -adv * eps_clip_c
        dual = (adv < 0) & (l3 < loss)
        loss = torch.where(dual, l3, loss)
        clipped = clipped | dual
    return loss, clipped.to(logprobs.dtype), -log_ratio.detach()


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_clip: float,
    eps_clip_high: Optional[float] = None,
    eps_clip_c: Optional[float] = None,
    sequence_level: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy loss per token [B, T] and metrics (masked means over all tokens):

    ``pg_clipfrac`` - fraction of masked tokens whose loss took a clipped branch;
    ``ppo_kl`` - masked mean of ``old_logprobs - logprobs`` (sequence-level value for GSPO).
    """
    loss, clipped, neg_log_ratio = policy_terms(
        logprobs, old_logprobs, advantages, mask, eps_clip, eps_clip_high, eps_clip_c, sequence_level
    )
    m = mask.to(loss.dtype)
    metrics = {
        "pg_clipfrac": float(masked_mean(clipped, m)),
        "ppo_kl": float(masked_mean(neg_log_ratio, m)),
    }
    return loss, metrics


def tis_weights(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance-sampling weights ``clamp(exp(old - rollout), clip_low, clip_high)``.

    Corrects for the rollout engine's policy differing from the trainer's. The
    weights carry no gradient. Metrics (masked means): ``tis_mean`` - mean of the
    *unclamped* ratio; ``tis_clipfrac`` - fraction of tokens the clamp changed.
    """
    if old_logprobs.shape != rollout_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(
            f"old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs {tuple(rollout_logprobs.shape)} "
            f"and mask {tuple(mask.shape)} must have the same shape"
        )
    if clip_low > clip_high:
        raise ValueError(f"tis clip_low={clip_low} is above clip_high={clip_high}")
    w, raw, changed = tis_terms(old_logprobs, rollout_logprobs, clip_low, clip_high)
    m = mask.float()
    metrics = {"tis_mean": float(masked_mean(raw, m)), "tis_clipfrac": float(masked_mean(changed, m))}
    return w, metrics


def tis_terms(
    old_logprobs: Tensor, rollout_logprobs: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token ``(clamped weight, unclamped ratio, 1.0 where the clamp changed it)``, no gradient
    (token-level TIS of ``slick.algo.correction``)."""
    return truncated_weights(old_logprobs.detach().float() - rollout_logprobs.detach().float(), clip_low, clip_high)

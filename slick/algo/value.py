"""The critic's math: PPO's clipped value loss and explained variance (the critic model lives in slick/train).

Per token, with value ``v`` (carries the gradient), the value when the batch was made ``v_old`` and the
return ``R`` (the GAE target, ``returns`` of :func:`slick.algo.ppo`), both constants::

    unclipped = (v - R)^2
    clipped   = (v_old + clamp(v - v_old, -c, c) - R)^2          # c = --value-clip
    loss      = 0.5 * max(unclipped, clipped)                     # 0.5 * unclipped when c is None

reduced over the masked tokens like the policy loss (:func:`slick.algo.reduce`: sample mode, or token mode
with ``per_token``; global ``num_samples``/``num_tokens`` make micro-batch results sum to the batch's).

Explained variance over the masked tokens (population variances)::

    EV = 1 - Var[R - V] / Var[R]

1 when the values predict the returns exactly, 0 when they are no better than a constant, negative when
worse. When the returns do not vary (``Var[R] < 1e-12``, including an empty mask) there is nothing to
explain and EV is defined as 0.0 (never NaN).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .reduce import reduce

EV_MIN_VAR = 1e-12


def value_loss(
    values: Tensor,
    old_values: Optional[Tensor],
    returns: Tensor,
    mask: Tensor,
    clip: Optional[float],
    per_token: bool,
    num_samples: Optional[float] = None,
    num_tokens: Optional[float] = None,
) -> tuple[Tensor, dict[str, float]]:
    """Scalar clipped value loss and metrics "value_loss", "vf_clipfrac", "values_mean", "returns_mean".

    All tensors are [B, T]. ``old_values=None`` means the values the batch was made with are the current
    ones (``values.detach()``: the clip cannot bind). ``clip=None`` turns clipping off ("vf_clipfrac" 0).
    A token counts as clipped when the clipped branch gave the larger loss. Every metric is reduced like the
    loss, so with global normalisers the micro-batch metrics sum to the batch's.
    """
    if not (values.shape == returns.shape == mask.shape):
        raise ValueError(f"value_loss: values {tuple(values.shape)}, returns {tuple(returns.shape)} and mask "
                         f"{tuple(mask.shape)} must have one shape [B, T]")
    if old_values is not None and old_values.shape != values.shape:
        raise ValueError(f"value_loss: old_values {tuple(old_values.shape)} must match values {tuple(values.shape)}")
    if clip is not None and clip <= 0:
        raise ValueError(f"value_loss: clip must be > 0 or None, got {clip}")
    values = values.float()
    mask = mask.to(values.dtype)
    returns = returns.detach().to(values.dtype)
    old = values.detach() if old_values is None else old_values.detach().to(values.dtype)
    unclipped = (values - returns) ** 2
    if clip is None:
        per_tok = 0.5 * unclipped
        clipped = torch.zeros_like(mask)
    else:
        v_clipped = old + (values - old).clamp(-clip, clip)
        sq_clipped = (v_clipped - returns) ** 2
        per_tok = 0.5 * torch.maximum(unclipped, sq_clipped)
        clipped = (sq_clipped > unclipped).to(values.dtype)

    def red(x: Tensor) -> Tensor:
        return reduce(x, mask, per_token, num_samples=num_samples, num_tokens=num_tokens)

    loss = red(per_tok)
    metrics = {
        "value_loss": float(loss.detach()),
        "vf_clipfrac": float(red(clipped)),
        "values_mean": float(red(values.detach())),
        "returns_mean": float(red(returns)),
    }
    return loss, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """``1 - Var[R - V] / Var[R]`` over the masked tokens, in float64; 0.0 when ``Var[R] < 1e-12`` (see module doc)."""
    if not (values.shape == returns.shape == mask.shape):
        raise ValueError(f"explained_variance: values {tuple(values.shape)}, returns {tuple(returns.shape)} and "
                         f"mask {tuple(mask.shape)} must have one shape")
    on = mask.detach().to(torch.float64) > 0
    r = returns.detach().to(torch.float64)[on]
    v = values.detach().to(torch.float64)[on]
    if r.numel() == 0:
        return 0.0
    var_r = float(r.var(unbiased=False))
    if var_r < EV_MIN_VAR:
        return 0.0
    return 1.0 - float((r - v).var(unbiased=False)) / var_r

"""Rollout correction: importance weights for the gap between the engine that sampled and the trainer.

The engine (slick's own, vLLM, SGLang) and the trainer compute the same policy with different kernels, so the
rollout logprobs ``r`` differ from the trainer's old logprobs ``o`` by roundings, and by more when the engine runs
other numerics or stale weights. Two corrections, each at token or sequence level (the references are verl's
rollout correction and slime's masked importance sampling):

* **TIS** (truncated importance sampling): weight ``clamp(ratio, low, high)``.
* **MIS** (masked importance sampling): weight 1 where ``low <= ratio <= high``, else 0 (the token, or the whole
  sequence, leaves the loss).

The ratio ``exp(o - r)`` is per token at ``token`` level; at ``sequence`` level every token of a sequence gets the
sequence's ``exp(sum(o - r))`` over its loss-masked tokens; at ``geometric`` level ``exp(mean(o - r))`` (the per-token
geometric mean, which does not explode with length). Weights carry no gradient. All functions take ``[B, T]``
tensors and a ``[B, T]`` loss mask.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

LEVELS = ("token", "sequence", "geometric")
GAP_THRESHOLD = 0.1   # train/rollout_logprob_gap_frac counts tokens whose |logprob gap| exceeds this


def log_ratios(old_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, level: str) -> Tensor:
    """Per-token ``log ratio`` ``[B, T]`` at ``level`` (module doc); 0 where ``mask`` is 0."""
    if old_logprobs.shape != rollout_logprobs.shape or old_logprobs.shape != mask.shape:
        raise ValueError(f"old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs "
                         f"{tuple(rollout_logprobs.shape)} and mask {tuple(mask.shape)} must have the same shape")
    m = mask.detach().float()
    d = (old_logprobs.detach().float() - rollout_logprobs.detach().float()) * m
    if level == "token":
        return d
    if level not in LEVELS:
        raise ValueError(f"unknown rollout-correction level {level!r} (choose {', '.join(LEVELS)})")
    seq = d.sum(-1, keepdim=True)
    if level == "geometric":
        seq = seq / m.sum(-1, keepdim=True).clamp(min=1.0)
    return seq.expand_as(d) * m


def truncated_weights(log_ratio: Tensor, low: float, high: float) -> tuple[Tensor, Tensor, Tensor]:
    """TIS: ``(clamp(ratio, low, high), ratio, 1.0 where the clamp changed it)``, no gradient."""
    _check_bounds(low, high, "tis")
    with torch.no_grad():
        raw = torch.exp(log_ratio)
        w = raw.clamp(min=low, max=high)
        return w, raw, (w != raw).float()


def masked_weights(log_ratio: Tensor, low: float, high: float) -> tuple[Tensor, Tensor, Tensor]:
    """MIS: ``(1.0 inside [low, high] else 0.0, ratio, 1.0 where masked out)``, no gradient."""
    _check_bounds(low, high, "mis")
    with torch.no_grad():
        raw = torch.exp(log_ratio)
        keep = ((raw >= low) & (raw <= high)).float()
        return keep, raw, 1.0 - keep


def _check_bounds(low: float, high: float, what: str) -> None:
    if low > high:
        raise ValueError(f"{what} lower bound {low} is above its upper bound {high}")


def gap_stats(logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, threshold: float) -> dict[str, float]:
    """Train/inference mismatch of one micro-batch, as additive sums and a max (so they reduce over micro-batches
    and ranks): ``abs_sum`` and ``n`` (their ratio is the mean absolute logprob gap), ``abs_max``, and ``over`` (tokens
    whose gap exceeds ``threshold``)."""
    m = mask.detach().float() > 0
    gap = (logprobs.detach().float() - rollout_logprobs.detach().float()).abs()[m]
    if gap.numel() == 0:
        return {"abs_sum": 0.0, "n": 0.0, "abs_max": 0.0, "over": 0.0}
    return {"abs_sum": float(gap.sum()), "n": float(gap.numel()), "abs_max": float(gap.max()),
            "over": float((gap > threshold).sum())}


def coarse_kl(engine: dict, trainer: dict) -> float:
    """KL(engine || trainer) of one next-token distribution, from the engine's top-k logprobs ``{token: logprob}``
    and the trainer's logprobs of the same tokens: the top-k tokens plus one bucket holding the rest of the
    vocabulary (so the whole distribution's mass is counted). It is a lower bound of the full KL (merging outcomes
    never increases a KL) and 0 when the two distributions agree."""
    if set(engine) != set(trainer):
        raise ValueError(f"coarse_kl: engine and trainer scored different tokens ({sorted(engine)[:5]}... vs "
                         f"{sorted(trainer)[:5]}...)")
    pe = torch.tensor([engine[t] for t in engine], dtype=torch.float64)
    pt = torch.tensor([trainer[t] for t in engine], dtype=torch.float64)
    kl = float((pe.exp() * (pe - pt)).sum())
    rest_e = max(0.0, 1.0 - float(pe.exp().sum()))
    rest_t = max(1e-300, 1.0 - float(pt.exp().sum()))
    if rest_e > 0.0:
        kl += rest_e * (math.log(rest_e) - math.log(rest_t))
    return max(kl, 0.0)

"""The learning-rate schedule: a linear warm-up, then constant or a linear / cosine decay to a floor.

``lr_factor(step)`` is the multiplier of the base learning rate at optimizer step ``step`` (0-based), for
``torch.optim.lr_scheduler.LambdaLR``: ``(step + 1) / warmup`` during the warm-up, then 1 (constant), or a decay
from 1 at the end of the warm-up to ``min_lr / lr`` at ``decay_iters`` and flat after it (Megatron's
--lr-decay-style / --lr-decay-iters / --min-lr).
"""
from __future__ import annotations

import math
from typing import Callable, Optional
from slick.config import Config, ConfigView


def lr_factor_fn(lr: float, warmup: int = 0, style: str = "constant", decay_iters: Optional[int] = None,
                 min_lr: float = 0.0) -> Callable[[int], float]:
    """``step -> factor`` of the schedule (module doc)."""
    warmup = int(warmup or 0)
    floor = float(min_lr) / float(lr) if lr else 0.0
    if style not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown --lr-decay-style {style!r} (constant, linear, cosine)")
    if style != "constant" and (not decay_iters or decay_iters <= warmup):
        raise ValueError(f"--lr-decay-style {style} needs --lr-decay-iters > --lr-warmup-steps (got {decay_iters})")

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return min(1.0, (step + 1) / warmup)
        if style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / float(decay_iters - warmup))
        if style == "linear":
            return 1.0 - (1.0 - floor) * progress
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor


def lr_factor_from_config(cfg: Config | ConfigView) -> Callable[[int], float]:
    """:func:`lr_factor_fn` of --lr, --lr-warmup-steps (train group), --lr-decay-style, --lr-decay-iters, --min-lr
    (sft_distill group)."""
    cfg = cfg.view("train", "sft_distill")
    return lr_factor_fn(cfg.lr, cfg.lr_warmup_steps, cfg.lr_decay_style, cfg.lr_decay_iters, cfg.min_lr)

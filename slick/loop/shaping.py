"""What the length of a sample does to its training (DAPO): the soft overlong penalty on its reward
(--overlong-buffer-len, slick/algo/shaping.py) and, with --mask-truncated, truncated samples out of the loss."""
from __future__ import annotations

import dataclasses

from slick.algo.shaping import overlong_penalty
from slick.config import Config
from slick.types import Status


def shape_for_training(cfg: Config, samples: list, rewards: list[float]) -> tuple[list, list[float], dict]:
    """``(samples, rewards, metrics)`` as training uses them: rewards plus the overlong penalty; truncated samples
    replaced by copies whose loss mask is all 0 (their rewards still count in their group's advantages). Metrics:
    ``train/overlong_penalty`` (mean penalty), ``train/overlong_frac`` (samples penalised), ``train/truncated_masked``
    (samples masked). ``samples`` and their loss masks are not changed."""
    metrics: dict = {}
    if cfg.overlong_buffer_len is not None:
        pens = [overlong_penalty(len(s.response_ids), cfg.rollout_max_response_len, cfg.overlong_buffer_len,
                                 float(cfg.overlong_penalty_factor)) for s in samples]
        rewards = [r + p for r, p in zip(rewards, pens)]
        metrics["train/overlong_penalty"] = sum(pens) / max(len(pens), 1)
        metrics["train/overlong_frac"] = sum(p < 0 for p in pens) / max(len(pens), 1)
    if cfg.mask_truncated:
        cut = [s.status == Status.TRUNCATED for s in samples]
        samples = [dataclasses.replace(s, loss_mask=[0] * len(s.response_ids)) if c else s
                   for s, c in zip(samples, cut)]
        metrics["train/truncated_masked"] = float(sum(cut))
    return samples, rewards, metrics

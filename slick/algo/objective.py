"""The whole policy objective the trainer calls: pg loss (+TIS) - entropy bonus + KL loss.

::

    loss = reduce(pg_loss_per_token * tis_weights * keep)     # pg: cfg.policy_loss (objectives.py);
                                                               # tis_weights only with cfg.use_tis; keep: OPSM and
                                                               # the high-entropy tokens (token_filters.py)
         - cfg.entropy_coef * reduce(entropy)
         + cfg.kl_loss_coef * reduce(kl(logprobs, ref_logprobs, cfg.kl_loss_type))
                                                               # only with cfg.use_kl_loss and ref given

``cfg`` is the typed algorithm settings (:class:`slick.algo.params.AlgoParams`, built once with
``AlgoParams.from_config(config)``). ``reduce`` is sample mode, or token mode when
``cfg.calculate_per_token_loss``;
``inputs.num_samples``/``inputs.num_tokens`` are the global normalisers for micro-batching.
Every metric is reduced the same way, so with global normalisers the metrics
of the micro-batches also sum to the global value.

Samples whose gradient is exactly zero (:func:`zero_gradient`: all advantages 0 and no entropy or KL term) need
not be computed: :class:`WholeBatchLoss` trains on the others with the whole batch's normalisers (the same
gradient), and the loop leaves them out unless ``--train-zero-advantage-samples`` (slick/loop/step.py).

A custom loss (``--custom-loss-function-path``, resolved by the caller) has the
same signature as :func:`compute_policy_objective`, ``fn(cfg, inputs: LossInputs)``,
and returns ``(loss scalar Tensor, metrics dict[str, float])``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch
from torch import Tensor

from .inputs import LossInputs
from .kl import kl
from .params import AlgoParams
from .correction import log_ratios, masked_weights, truncated_weights
from .objectives import BATCH_COUPLED, loss_name, policy_objective_terms
from .reduce import reduce
from .slime_loss import SlimeLossHooks
from .token_filters import high_entropy_keep, opsm_drop


def compute_policy_objective(cfg: AlgoParams, inputs: LossInputs,
                             slime: Optional[SlimeLossHooks] = None) -> tuple[Tensor, dict[str, float]]:
    """Scalar training loss and metrics ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss",
    "entropy_loss", "tis_mean"/"tis_clipfrac" when ``cfg.use_tis``, "mis_mean"/"mis_maskfrac" when ``cfg.use_mis``).
    ``slime``: slime's TIS function and pg-loss reducer (slick/algo/slime_loss.py), when the run sets them.

    ``old_logprobs=None`` means on-policy: ``logprobs.detach()`` is used (ratio 1,
    gradient ``-A``). ``entropy`` may be None when ``cfg.entropy_coef`` is 0
    ("entropy_loss" is then 0.0); "kl_loss" is 0.0 when no KL loss is computed.
    """
    _check_types(cfg, inputs)
    entropy, advantages = inputs.entropy, inputs.advantages
    old_logprobs, ref_logprobs, rollout_logprobs = inputs.old_logprobs, inputs.ref_logprobs, inputs.rollout_logprobs
    num_samples, num_tokens = inputs.num_samples, inputs.num_tokens
    logprobs, mask = inputs.logprobs, inputs.mask
    logprobs = logprobs.float()  # all loss arithmetic in fp32; gradients flow back to bf16 inputs
    mask = mask.to(logprobs.dtype)
    per_token = bool(cfg.calculate_per_token_loss)

    def red(x: Tensor) -> Tensor:
        return reduce(x, mask, per_token, num_samples=num_samples, num_tokens=num_tokens)

    def red_metric(x: Tensor) -> Tensor:   # means over the samples trained on (WholeBatchLoss), else like red
        return reduce(x, mask, per_token, num_samples=_first(inputs.metric_num_samples, num_samples),
                      num_tokens=_first(inputs.metric_num_tokens, num_tokens))

    old = logprobs.detach() if old_logprobs is None else old_logprobs
    terms = policy_objective_terms(cfg, logprobs, old, advantages, mask)   # --policy-loss (slick/algo/objectives.py)
    pg, clipped, neg_log_ratio = terms.loss, terms.clipped, terms.neg_log_ratio
    metrics: dict[str, float] = {k: float(red_metric(v)) for k, v in terms.extra.items()}
    pg_mask = pg_masks = None   # slime's TIS function's loss masks (numerators only), when it ran
    if cfg.use_tis and slime is not None and slime.tis is not None:
        pg, pg_mask, pg_masks = slime.correct(pg, old, rollout_logprobs, mask, red_metric, metrics, inputs)
        cfg = replace(cfg, use_tis=False)   # the function took --use-tis's place; --use-mis still applies
    if cfg.use_tis or cfg.use_mis:   # rollout correction (slick/algo/correction.py)
        pg = _rollout_correction(cfg, pg, old, rollout_logprobs, mask, red_metric, metrics, terms.per_sequence)
    pg = _token_filters(cfg, pg, logprobs, old, advantages, entropy, mask, red_metric, metrics)

    if slime is not None and slime.reducer is not None:
        pg_loss = slime.reduce_pg(pg, pg_masks, mask, per_token, num_samples, num_tokens, inputs)
    else:
        pg_loss = red(pg if pg_mask is None else pg * pg_mask)
    loss = pg_loss

    entropy_coef = float(cfg.entropy_coef)
    if entropy is not None:
        entropy_loss = red(entropy.to(logprobs.dtype))
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * entropy_loss
    elif entropy_coef != 0.0:
        raise ValueError(f"entropy_coef={entropy_coef} needs the per-token entropy [B, T]; got None")
    else:
        entropy_loss = torch.zeros((), dtype=logprobs.dtype)

    kl_loss = torch.zeros((), dtype=logprobs.dtype)
    if cfg.use_kl_loss and ref_logprobs is not None:
        kl_loss = red(kl(logprobs, ref_logprobs, cfg.kl_loss_type).to(logprobs.dtype))
        loss = loss + float(cfg.kl_loss_coef) * kl_loss

    metrics.update(
        loss=float(loss.detach()),
        pg_loss=float(pg_loss.detach()),
        pg_clipfrac=float(red_metric(clipped)),
        ppo_kl=float(red_metric(neg_log_ratio)),
        kl_loss=float(kl_loss.detach()),
        entropy_loss=0.0 if entropy is None else float(red_metric(entropy.detach().to(logprobs.dtype))),
    )
    return loss, metrics


def zero_gradient(cfg: AlgoParams, advantages: Tensor) -> bool:
    """True when :func:`compute_policy_objective`'s gradient for a sample with these per-token ``advantages`` is
    exactly zero whatever the model predicts: every advantage is 0 (GRPO/RLOO/GSPO give a whole group 0 when its
    rewards are equal), and the objective has no other term (``entropy_coef`` 0, no KL loss). The policy term
    ``-A * ratio`` (clipped, times the TIS/MIS weights) is then 0 at every token."""
    if float(cfg.entropy_coef) != 0.0 or (cfg.use_kl_loss and float(cfg.kl_loss_coef) != 0.0):
        return False
    if loss_name(cfg) in BATCH_COUPLED or float(cfg.high_entropy_token_ratio) < 1.0:
        return False   # tokens chosen over the whole micro-batch: every sample takes part in the choice
    return bool(torch.as_tensor(advantages).eq(0).all())


@dataclass(frozen=True)
class WholeBatchLoss:
    """A loss function for a subset of a batch whose other samples add exactly zero to the loss and its gradient
    (:func:`zero_gradient`): each call gets the *whole* batch's normalisers, so the accumulated gradient and the
    ``loss``/``pg_loss`` metrics are the whole batch's, and the subset's own as the metric normalisers, so the
    other metrics (clip fraction, KL to the old policy, entropy, TIS/MIS) are means over the samples trained on.
    Picklable (Ray trainer ranks receive it)."""

    loss_fn: Callable
    num_samples: float
    num_tokens: float

    def __call__(self, inputs: LossInputs):
        return self.loss_fn(replace(inputs, num_samples=self.num_samples, num_tokens=self.num_tokens,
                                    metric_num_samples=inputs.num_samples, metric_num_tokens=inputs.num_tokens))


def _first(a, b):
    return b if a is None else a


def _check_types(cfg: object, inputs) -> None:
    """A clear TypeError for a caller that passes a Config or loose tensors."""
    if not isinstance(inputs, LossInputs):
        raise TypeError(f"compute_policy_objective(cfg, inputs): inputs must be a slick.algo.LossInputs, "
                        f"got {type(inputs).__name__}; see docs/algorithms.md")
    if not isinstance(cfg, AlgoParams):
        raise TypeError(f"compute_policy_objective(cfg, inputs): cfg must be a slick.algo.AlgoParams "
                        f"(AlgoParams.from_config(config)), got {type(cfg).__name__}; see docs/algorithms.md")


def _token_filters(cfg: AlgoParams, pg: Tensor, logprobs: Tensor, old: Tensor, advantages: Tensor, entropy,
                   mask: Tensor, red, metrics: dict[str, float]) -> Tensor:
    """``pg`` without the tokens OPSM drops (--use-opsm) and with only the high-entropy ones (--high-entropy-token-
    ratio), slick/algo/token_filters.py; their fractions (and the kept tokens' entropy) go into ``metrics``."""
    if cfg.use_opsm:
        drop = opsm_drop(logprobs, old, advantages, mask, float(cfg.opsm_delta))
        pg = pg * (1.0 - drop)
        metrics["opsm_maskfrac"] = float(red(drop))
    ratio = float(cfg.high_entropy_token_ratio)
    if ratio < 1.0:
        if entropy is None:
            raise ValueError("--high-entropy-token-ratio needs the per-token entropy [B, T]; got None")
        keep = high_entropy_keep(entropy.detach(), mask, ratio)
        pg = pg * keep
        metrics["entropy_keepfrac"] = float(red(keep))
        metrics["entropy_kept"] = float(red(entropy.detach().float() * keep))
    return pg


def _rollout_correction(cfg: AlgoParams, pg: Tensor, old: Tensor, rollout_logprobs, mask: Tensor, red,
                        metrics: dict[str, float], per_sequence: bool = False) -> Tensor:
    """``pg`` times the truncated (TIS) and/or masked (MIS) importance weights of trainer vs engine logprobs;
    their means and clip/mask fractions go into ``metrics``. ``per_sequence`` (GMPO): the TIS weight of a sequence
    is the geometric mean of its tokens' weights (as verl's geo_mean)."""
    if rollout_logprobs is None:
        raise ValueError("use_tis/use_mis need rollout_logprobs [B, T] (the engine's logprobs); got None")
    if rollout_logprobs.shape != mask.shape:
        raise ValueError(f"rollout_logprobs {tuple(rollout_logprobs.shape)} must match mask {tuple(mask.shape)}")
    if cfg.use_tis:
        w, raw, changed = truncated_weights(log_ratios(old, rollout_logprobs, mask, cfg.tis_level),
                                            float(cfg.tis_clip_low), float(cfg.tis_clip))
        if per_sequence:
            w = torch.exp((torch.log(w + 1e-10) * mask).sum(-1, keepdim=True) / (mask.sum(-1, keepdim=True) + 1e-8))
        pg = pg * w.to(pg.dtype)
        metrics["tis_mean"] = float(red(raw.to(mask.dtype)))
        metrics["tis_clipfrac"] = float(red(changed.to(mask.dtype)))
    if cfg.use_mis:
        keep, raw, dropped = masked_weights(log_ratios(old, rollout_logprobs, mask, cfg.mis_level),
                                            float(cfg.mis_low), float(cfg.mis_high))
        pg = pg * keep.to(pg.dtype)
        metrics["mis_mean"] = float(red(raw.to(mask.dtype)))
        metrics["mis_maskfrac"] = float(red(dropped.to(mask.dtype)))
    return pg

"""What estimators and losses receive and return, as data (the trainer stays algorithm-agnostic).

Every advantage estimator (the built-in ones and ``--custom-advantage-function-path``)::

    estimator(inputs: AdvantageInputs) -> AdvantageOutputs

Every policy loss (``compute_policy_objective`` and ``--custom-loss-function-path``)::

    loss_fn(cfg: AlgoParams, inputs: LossInputs) -> (loss scalar Tensor, metrics dict[str, float])

``cfg`` is the typed algorithm settings (:class:`slick.algo.params.AlgoParams`). The trainer binds
``cfg`` (``functools.partial``) and calls ``loss_fn(inputs)`` once per packed micro-batch. New inputs
become new fields with a default, so plug-ins written today keep working.

:func:`check_plugin_signature` refuses, at start-up, a custom function written for the old
positional signatures (``fn(rewards, mask, *, group_size, ...)`` and
``fn(cfg, logprobs, entropy, mask, advantages, ...)``), naming the flag and the new signature.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from .params import AlgoParams

ESTIMATOR_SIGNATURE = "fn(inputs: slick.algo.AdvantageInputs) -> slick.algo.AdvantageOutputs"
LOSS_SIGNATURE = "fn(cfg, inputs: slick.algo.LossInputs) -> (loss Tensor, metrics dict)"   # cfg: AlgoParams
# parameter names of the positional signatures used before the dataclasses
_OLD_NAMES = {"rewards", "mask", "group_size", "logprobs", "entropy", "advantages"}


def _check_like(name: str, t: Optional[Tensor], shape: torch.Size, what: str) -> None:
    if t is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what}.{name} has shape {tuple(t.shape)}; it must match mask {tuple(shape)}")


@dataclass
class AdvantageInputs:
    """One batch for an advantage estimator; samples ordered group by group.

    ``rewards`` [B] scalar reward per sample; ``mask`` [B, T] float, 1.0 on the response tokens that
    count (0 on padding and on tool/environment tokens); ``group_size`` samples per prompt; ``cfg``
    the typed algorithm settings (:class:`AlgoParams`, ``AlgoParams.from_config(config)``; None only for
    estimators that read no flag, e.g. ``rloo``); ``old_logprobs``/``ref_logprobs``/``values``
    optional [B, T] (``values``: the critic's per-token values, needed by ``ppo``).
    """

    rewards: Tensor
    mask: Tensor
    group_size: int
    cfg: Optional[AlgoParams] = None
    old_logprobs: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None
    values: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if not isinstance(self.mask, Tensor) or self.mask.dim() != 2:
            raise ValueError(f"AdvantageInputs.mask must be a [B, T] tensor, got "
                             f"{tuple(self.mask.shape) if isinstance(self.mask, Tensor) else type(self.mask).__name__}")
        if self.cfg is not None and not isinstance(self.cfg, AlgoParams):
            raise TypeError(f"AdvantageInputs.cfg must be a slick.algo.AlgoParams (AlgoParams.from_config(cfg)) "
                            f"or None, got {type(self.cfg).__name__}")
        self.rewards = torch.as_tensor(self.rewards, dtype=torch.float32, device=self.mask.device)
        for name in ("old_logprobs", "ref_logprobs", "values"):
            _check_like(name, getattr(self, name), self.mask.shape, "AdvantageInputs")

    def params(self, who: str) -> AlgoParams:
        """``cfg``, or a ValueError naming the estimator ``who`` that needs it."""
        if self.cfg is None:
            raise ValueError(f"advantage estimator {who!r} reads algorithm flags: pass "
                             f"AdvantageInputs(..., cfg=slick.algo.AlgoParams.from_config(config))")
        return self.cfg


@dataclass
class AdvantageOutputs:
    """``advantages`` [B, T] (0 outside the mask) and ``returns`` [B, T] (the critic's target for ``ppo``;
    equal to the advantages for estimators without a critic)."""

    advantages: Tensor
    returns: Tensor


@dataclass
class LossInputs:
    """One packed micro-batch for a loss, every tensor [B, T] (B = the micro-batch's samples): the trainer's
    output for it and the batch's columns (``slick.algo.batch.TrainBatch``) under their own names.

    A policy head's ``logprobs`` carry the gradient (``values`` None); a value head's ``values`` do (``logprobs``
    None), with the batch's ``returns`` and the rollout's ``old_values``. ``entropy`` may be None when
    ``entropy_coef`` is 0; ``old_logprobs=None`` means on-policy; ``rollout_logprobs`` are the engine's (for TIS);
    ``num_samples``/``num_tokens`` are the *global* batch normalisers (see ``reduce``);
    ``metric_num_samples``/``metric_num_tokens``, when set, those of the samples the step trains on, for the
    metrics that describe them (samples whose loss gradient is exactly zero were left out:
    :class:`slick.algo.objective.WholeBatchLoss`). ``prompt_lengths``/``response_lengths``: each sample's
    token counts (the trainer gives them; slime's loss hooks get them as slime does).
    """

    logprobs: Optional[Tensor]
    entropy: Optional[Tensor]
    mask: Tensor
    advantages: Optional[Tensor]
    old_logprobs: Optional[Tensor] = None
    ref_logprobs: Optional[Tensor] = None
    rollout_logprobs: Optional[Tensor] = None
    num_samples: Optional[float] = None
    num_tokens: Optional[float] = None
    metric_num_samples: Optional[float] = None
    metric_num_tokens: Optional[float] = None
    values: Optional[Tensor] = None
    returns: Optional[Tensor] = None
    old_values: Optional[Tensor] = None
    prompt_lengths: Optional[list] = None
    response_lengths: Optional[list] = None

    def __post_init__(self) -> None:
        shape = self.mask.shape
        for name in ("logprobs", "entropy", "advantages", "old_logprobs", "ref_logprobs", "rollout_logprobs",
                     "values", "returns", "old_values"):
            _check_like(name, getattr(self, name), shape, "LossInputs")


def check_plugin_signature(fn: Callable, flag: str) -> Callable:
    """Return ``fn`` when it takes the dataclass signature of ``flag``'s kind, else raise a ValueError.

    ``flag`` is ``--custom-advantage-function-path`` (one argument: :class:`AdvantageInputs`) or
    ``--custom-loss-function-path`` (two: ``cfg`` and :class:`LossInputs`). A function with a
    parameter named like the old positional signatures (rewards, mask, group_size, logprobs,
    entropy, advantages) or that cannot be called with exactly those arguments is refused.
    """
    loss = "loss" in flag
    expected, nargs = (LOSS_SIGNATURE, 2) if loss else (ESTIMATOR_SIGNATURE, 1)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to inspect
        return fn
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    old = sorted(_OLD_NAMES & set(sig.parameters))
    problem = f"has parameter(s) {', '.join(old)} of the old positional signature" if old else None
    if problem is None:
        try:
            sig.bind(*([None] * nargs))
        except TypeError as e:
            problem = f"cannot be called with {nargs} positional argument(s) ({e})"
    if problem:
        raise ValueError(
            f"{flag}: {name}{sig} {problem}; the signature is now {expected} "
            f"(the inputs are one dataclass: docs/algorithms.md, 'Custom functions')")
    return fn

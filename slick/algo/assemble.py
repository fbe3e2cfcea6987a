"""From a scored TrainBatch to its advantages, and the objective the trainer minimises: built once per run.

:class:`Advantages` holds what the run's config chose (the estimator or the ``--custom-advantage-function-path``
plug-in, its signature checked once, ``AlgoParams``, normalisation, on-policy distillation, SFT) and turns a
batch into the same batch with its ``advantages`` (and, with critic values, ``returns``) columns. Agent sessions
split into several samples get their episode's advantage on every sample (``slick.algo.sessions``).
:func:`objective_from_config` is the ``objective(LossInputs)`` the trainer calls: the policy objective, the SFT
loss or the ``--custom-loss-function-path`` plug-in, bound to ``AlgoParams`` (and the policy objective to slime's
TIS function and pg-loss reducer, when set: ``slick.algo.slime_loss``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from slick.algo.batch import TrainBatch, pad
from slick.algo.distill import add_opd_terms
from slick.algo.estimators import get_estimator, normalize_advantages
from slick.algo.inputs import AdvantageInputs, AdvantageOutputs, check_plugin_signature
from slick.algo.objective import compute_policy_objective
from slick.algo.params import AlgoParams
from slick.algo.sessions import check_session_estimator, session_heads, split_sessions, spread_session_advantages
from slick.algo.sft import sft_objective
from slick.algo.slime_loss import SlimeLossHooks
from slick.algo.turns import TURN_ESTIMATORS, has_turn_rewards, turn_advantages
from slick.config import Config
from slick.config.sft_distill import is_sft
from slick.plugins import load_function


def load_custom(cfg: Config, which: str) -> Optional[Callable]:
    """The custom ``advantage`` or ``loss`` function of ``cfg`` (None when unset), its signature checked:
    one written for the old positional signature is refused with a ValueError naming the flag."""
    flag = f"--custom-{which}-function-path"
    fn = load_function(cfg.custom_advantage_function_path if which == "advantage" else cfg.custom_loss_function_path,
                       flag)
    return None if fn is None else check_plugin_signature(fn, flag)


def objective_from_config(cfg: Config) -> Callable:
    """``objective(inputs: LossInputs) -> (loss, metrics)`` for the trainer: the policy objective, the SFT loss
    (--loss-type sft_loss) or the custom loss, bound to the typed algorithm settings (``AlgoParams``)."""
    base = sft_objective if is_sft(cfg) else compute_policy_objective
    fn = load_custom(cfg, "loss") or base
    slime = SlimeLossHooks.from_config(cfg) if fn is compute_policy_objective else None   # slick/algo/slime_loss.py
    if slime is not None:
        return functools.partial(fn, AlgoParams.from_config(cfg), slime=slime)
    return functools.partial(fn, AlgoParams.from_config(cfg))


def student_logprobs(batch: TrainBatch) -> list:
    """The student's logprobs of its sampled tokens for OPD: the batch's old logprobs when computed, else the
    engine's sampling logprobs."""
    if batch.old_logprobs is not None:
        return batch.old_logprobs
    return [torch.tensor(s.rollout_logprobs, dtype=torch.float32) for s in batch.samples]


@dataclass(frozen=True)
class Advantages:
    """The run's advantage assembly (build it with :meth:`from_config`; call it on a batch)."""

    params: AlgoParams
    estimator: Callable
    estimator_name: str
    custom: bool                 # the estimator is a --custom-advantage-function-path plug-in
    group_size: int
    normalize: bool
    kl_coef: float
    none: bool                   # SFT or --disable-compute-advantages-and-returns: zeros, which no loss reads
    opd: bool
    opd_only: bool
    opd_kl_coef: float
    turn_gamma: float = 1.0      # per-turn rewards (slick.algo.turns): discount and normalisation
    turn_norm: str = "episode"

    @classmethod
    def from_config(cls, cfg: Config) -> "Advantages":
        custom = load_custom(cfg, "advantage")
        return cls(params=AlgoParams.from_config(cfg), estimator=custom or get_estimator(cfg.advantage_estimator),
                   estimator_name=cfg.advantage_estimator, custom=custom is not None,
                   group_size=cfg.n_samples_per_prompt, normalize=bool(cfg.normalize_advantages),
                   kl_coef=float(cfg.kl_coef or 0.0),
                   none=is_sft(cfg) or bool(cfg.disable_compute_advantages_and_returns),
                   opd=bool(cfg.use_opd), opd_only=bool(cfg.opd_only), opd_kl_coef=float(cfg.opd_kl_coef),
                   turn_gamma=float(cfg.turn_gamma), turn_norm=cfg.turn_advantage_norm)

    def __call__(self, batch: TrainBatch) -> TrainBatch:
        """``batch`` with its advantages (and, when it has critic values, returns); with --use-opd plus (or,
        --opd-only, replaced by) the teacher's term (slick/algo/distill.py)."""
        if self.none:
            return batch.with_columns(advantages=[torch.zeros(len(t)) for t in batch.tokens])
        if self.opd:
            return self._with_opd(batch)
        return self._with_estimator(batch)

    def _with_estimator(self, batch: TrainBatch) -> TrainBatch:
        if batch.values is None:
            return batch.with_columns(advantages=self.compute(batch.samples, batch.rewards, batch.old_logprobs,
                                                              batch.ref_logprobs))
        advantages, returns = self.compute(batch.samples, batch.rewards, batch.old_logprobs, batch.ref_logprobs,
                                           values=batch.values, with_returns=True)
        return batch.with_columns(advantages=advantages, returns=returns)

    def _with_opd(self, batch: TrainBatch) -> TrainBatch:
        """The estimator's advantages plus --opd-kl-coef x (teacher - student logprob) per token, less the term's
        mean over the batch's trained tokens (its baseline, slick/algo/distill.py); --opd-only: the term alone,
        whitened over the batch's tokens when advantages are normalised, else centred."""
        student = student_logprobs(batch)
        if self.opd_only:
            base = [torch.zeros(len(t)) for t in batch.tokens]
        else:
            batch = self._with_estimator(batch)
            base = batch.advantages
        whiten = self.opd_only and self.normalize
        adv = add_opd_terms(base, batch.teacher_logprobs, student, batch.loss_mask, self.opd_kl_coef,
                            only=self.opd_only, centre=not whiten)
        if whiten:
            width = max([len(a) for a in adv] + [1])
            white = normalize_advantages(pad(adv, width), batch.padded("loss_mask"))
            adv = [white[i, :len(a)] for i, a in enumerate(adv)]
        return batch.with_columns(advantages=adv)

    def compute(self, samples: Sequence, rewards: Sequence, old_logprobs=None, ref_logprobs=None, values=None,
                with_returns: bool = False):
        """Per-sample advantage tensors (one value per response token) from the estimator; with
        ``with_returns`` the pair ``(advantages, returns)`` (returns: the critic's targets).

        ``old_logprobs``/``ref_logprobs``/``values`` are optional lists of 1-D per-token tensors, one per sample.
        """
        sessions = split_sessions(samples)   # agent sessions that became several samples
        if any(has_turn_rewards(getattr(s, "reward", None)) for s in samples):
            return self._turn_level(samples, rewards, sessions, values is not None or with_returns)
        if sessions is not None:   # refuses estimators that are not outcome-level (ppo among them), naming the flag
            check_session_estimator(sessions, self.estimator_name, self.kl_coef, self.custom)
            heads = session_heads(sessions)
            head_adv = self.compute([samples[h] for h in heads], [rewards[h] for h in heads])
            if with_returns or values is not None:
                raise ValueError("agent sessions split into several samples support only outcome-level "
                                 "estimators, which use no critic values or returns (docs/agents.md)")
            return spread_session_advantages(sessions, head_adv, [s.loss_mask for s in samples])
        lengths = [len(s.response_ids) for s in samples]
        width = max(lengths + [1])
        for name, seq in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs), ("values", values)):
            if seq is not None and len(seq) != len(samples):
                raise ValueError(f"advantages: {len(samples)} samples but {len(seq)} {name}")
            bad = [] if seq is None else [i for i, (x, n) in enumerate(zip(seq, lengths)) if len(x) != n]
            if bad:
                raise ValueError(f"advantages: {name}[{bad[0]}] has {len(seq[bad[0]])} values for a response "
                                 f"of {lengths[bad[0]]} tokens")
        if values is None and self.estimator_name == "ppo":
            values = [torch.zeros(n) for n in lengths]  # no critic: zero values make GAE a lambda-return
        mask = pad([s.loss_mask for s in samples], width)
        inputs = AdvantageInputs(
            rewards=torch.tensor(list(rewards), dtype=torch.float32), mask=mask, group_size=self.group_size,
            cfg=self.params,
            old_logprobs=None if old_logprobs is None else pad(old_logprobs, width),
            ref_logprobs=None if ref_logprobs is None else pad(ref_logprobs, width),
            values=None if values is None else pad([v.detach().float().cpu() for v in values], width))
        out = self.estimator(inputs)
        if not isinstance(out, AdvantageOutputs):
            raise TypeError(f"advantage estimator {getattr(self.estimator, '__qualname__', self.estimator)} "
                            f"returned {type(out).__name__}; it must return "
                            f"slick.algo.AdvantageOutputs(advantages, returns)")
        adv = normalize_advantages(out.advantages, mask) if self.normalize else out.advantages
        advantages = [adv[i, :n] for i, n in enumerate(lengths)]
        if with_returns:
            return advantages, [out.returns[i, :n] for i, n in enumerate(lengths)]
        return advantages

    def _turn_level(self, samples: Sequence, rewards: Sequence, sessions, critic: bool) -> list:
        """Per-turn rewards (a reward function returned a list): each turn's tokens get its group-normalised
        discounted return (slick.algo.turns)."""
        if self.custom or self.estimator_name not in TURN_ESTIMATORS or self.kl_coef or critic:
            raise ValueError(f"per-turn rewards need --advantage-estimator {'/'.join(TURN_ESTIMATORS)} without "
                             f"--kl-coef, a critic or a custom advantage function (got {self.estimator_name}; "
                             f"docs/agents.md, Turn-level rewards)")
        if sessions is not None:
            raise ValueError("per-turn rewards on episodes split into one sample per turn (a chat template that "
                             "rewrites earlier turns, or an agent session) are not supported yet; docs/agents.md")
        adv = turn_advantages([s.reward for s in samples], list(rewards), [s.loss_mask for s in samples],
                              self.group_size, gamma=self.turn_gamma, norm=self.turn_norm,
                              divide_by_std=not self.params.disable_grpo_std_normalization,
                              normalize_rewards=not self.params.disable_rewards_normalization,
                              names=[f"sample {getattr(s, 'index', i)}" for i, s in enumerate(samples)])
        if not self.normalize:
            return adv
        width = max([len(a) for a in adv] + [1])
        white = normalize_advantages(pad(adv, width), pad([s.loss_mask for s in samples], width))
        return [white[i, :len(a)] for i, a in enumerate(adv)]

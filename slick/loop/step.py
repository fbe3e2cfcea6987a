"""One training phase of a step: a TrainBatch (slick.algo.batch) -> logprobs, values -> advantages (algo/)
-> optimizer steps (Trainer), each on a slice of the batch."""
from __future__ import annotations

import functools
import logging
import time

import torch

from slick.algo import (AdvantageInputs, AdvantageOutputs, AlgoParams, check_plugin_signature, get_estimator,
                        normalize_advantages)
from slick.algo.batch import TrainBatch
from slick.algo.distill import add_opd_terms, opd_metrics
from slick.algo.sft import sft_objective
from slick.config.sft_distill import is_sft
from slick.algo.objective import WholeBatchLoss, compute_policy_objective, zero_gradient
from slick.algo.sessions import check_session_estimator, session_heads, split_sessions, spread_session_advantages
from slick.plugins import load_function
from slick.train.critic import train_critic
from slick.train.packing import loss_mask, pad

log = logging.getLogger(__name__)
COUNTS = ("skipped_steps", "nonfinite_losses")  # summed over a step's optimizer steps; other metrics averaged


class NonFiniteTrainingError(RuntimeError):
    """Every optimizer step of a rollout step was skipped for a non-finite loss or gradient norm.

    Raised before anything is synced, saved or exported; ``batch`` holds the step's TrainBatch with its
    advantages and logprobs for the debug dump (``tensors``: those columns as :func:`train_on_samples` returns them).
    """

    def __init__(self, message: str, batch: TrainBatch):
        super().__init__(message)
        self.batch = batch
        self.tensors = debug_tensors(batch)


def debug_tensors(batch: TrainBatch) -> dict:
    """The per-sample advantages and old/ref logprobs of ``batch``, as :func:`train_on_samples` returns them."""
    return {"advantages": batch.advantages, "old_logprobs": batch.old_logprobs, "ref_logprobs": batch.ref_logprobs}


def load_custom(cfg, which: str):
    """The custom ``advantage`` or ``loss`` function of ``cfg`` (None when unset), its signature checked:
    one written for the old positional signature is refused with a ValueError naming the flag."""
    flag = f"--custom-{which}-function-path"
    fn = load_function(getattr(cfg, f"custom_{which}_function_path"), flag)
    return None if fn is None else check_plugin_signature(fn, flag)


def make_loss_fn(cfg):
    """``loss_fn(inputs: LossInputs) -> (loss, metrics)`` for the trainer: the policy objective or the custom loss,
    bound to the typed algorithm settings (``AlgoParams``)."""
    base = sft_objective if is_sft(cfg) else compute_policy_objective   # --loss-type sft_loss: slick/algo/sft.py
    return functools.partial(load_custom(cfg, "loss") or base, AlgoParams.from_config(cfg))


def compute_advantages(cfg, samples, rewards, old_logprobs=None, ref_logprobs=None, values=None,
                       with_returns: bool = False):
    """Per-sample advantage tensors (one value per response token) from the configured estimator.

    ``old_logprobs``/``ref_logprobs``/``values`` are optional lists of 1-D per-token tensors, one per sample
    (``values``: the critic's values of the response tokens). With ``with_returns`` the result is
    ``(advantages, returns)``, both per-sample lists (returns: the critic's targets).
    """
    sessions = split_sessions(samples)   # agent sessions that became several samples (slick/algo/sessions.py)
    if sessions is not None:   # refuses estimators that are not outcome-level (ppo among them), naming the flag
        check_session_estimator(sessions, cfg.advantage_estimator, cfg.kl_coef,
                                bool(cfg.custom_advantage_function_path))
        heads = session_heads(sessions)
        head_adv = compute_advantages(cfg, [samples[h] for h in heads], [rewards[h] for h in heads])
        advantages = spread_session_advantages(sessions, head_adv, [s.loss_mask for s in samples])
        if with_returns or values is not None:
            raise ValueError("agent sessions split into several samples support only outcome-level estimators, "
                             "which use no critic values or returns (docs/agents.md)")
        return advantages
    lengths = [len(s.response_ids) for s in samples]
    width = max(lengths + [1])
    mask = pad([s.loss_mask for s in samples], width)
    for name, seq in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs), ("values", values)):
        if seq is not None and len(seq) != len(samples):
            raise ValueError(f"compute_advantages: {len(samples)} samples but {len(seq)} {name}")
        bad = [] if seq is None else [i for i, (x, n) in enumerate(zip(seq, lengths)) if len(x) != n]
        if bad:
            raise ValueError(f"compute_advantages: {name}[{bad[0]}] has {len(seq[bad[0]])} values for a response "
                             f"of {lengths[bad[0]]} tokens")
    if values is None and cfg.advantage_estimator == "ppo":
        values = [torch.zeros(n) for n in lengths]  # no critic: zero values make GAE a lambda-return
    inputs = AdvantageInputs(
        rewards=torch.tensor(rewards, dtype=torch.float32), mask=mask, group_size=cfg.n_samples_per_prompt,
        cfg=AlgoParams.from_config(cfg),
        old_logprobs=None if old_logprobs is None else pad(old_logprobs, width),
        ref_logprobs=None if ref_logprobs is None else pad(ref_logprobs, width),
        values=None if values is None else pad([v.detach().float().cpu() for v in values], width))
    estimator = load_custom(cfg, "advantage") or get_estimator(cfg.advantage_estimator)
    out = estimator(inputs)
    if not isinstance(out, AdvantageOutputs):
        raise TypeError(f"advantage estimator {getattr(estimator, '__qualname__', estimator)} returned "
                        f"{type(out).__name__}; it must return slick.algo.AdvantageOutputs(advantages, returns)")
    adv = out.advantages
    if cfg.normalize_advantages:
        adv = normalize_advantages(adv, mask)
    advantages = [adv[i, :n] for i, n in enumerate(lengths)]
    if with_returns:
        return advantages, [out.returns[i, :n] for i, n in enumerate(lengths)]
    return advantages


def optimizer_batch_size(cfg, num_samples: int) -> int:
    """Samples per optimizer step: --global-batch-size, or more when agent sessions that split into several
    samples made the batch larger than planned (the batch is then spread over the --num-steps-per-rollout steps)."""
    return max(cfg.global_batch_size, -(-num_samples // cfg.num_steps_per_rollout))


def with_advantages(cfg, batch: TrainBatch) -> TrainBatch:
    """``batch`` with its advantages (and, when it has critic values, returns) from the configured estimator;
    with --use-opd plus (or, --opd-only, replaced by) the teacher's term (slick/algo/distill.py); without
    advantages (SFT, --disable-compute-advantages-and-returns) zeros, which the SFT loss does not read."""
    if is_sft(cfg) or cfg.disable_compute_advantages_and_returns:
        return batch.with_columns(advantages=[torch.zeros(len(t)) for t in batch.tokens])
    if cfg.use_opd:
        return with_opd_advantages(cfg, batch)
    return with_estimator_advantages(cfg, batch)


def with_opd_advantages(cfg, batch: TrainBatch) -> TrainBatch:
    """The estimator's advantages plus --opd-kl-coef x (teacher - student logprob) per token (--opd-only: the
    term alone). The student's logprobs: the batch's old logprobs when computed, else the rollout's."""
    student = student_logprobs(batch)
    if cfg.opd_only:
        base = [torch.zeros(len(t)) for t in batch.tokens]
    else:
        batch = with_estimator_advantages(cfg, batch)
        base = batch.advantages
    adv = add_opd_terms(base, batch.teacher_logprobs, student, batch.loss_mask, cfg.opd_kl_coef, only=cfg.opd_only)
    if cfg.opd_only and cfg.normalize_advantages:   # pure distillation: whitened over the batch's tokens
        lengths = [len(a) for a in adv]
        white = normalize_advantages(pad(adv, max(lengths + [1])), pad(batch.loss_mask, max(lengths + [1])))
        adv = [white[i, :n] for i, n in enumerate(lengths)]
    return batch.with_columns(advantages=adv)


def student_logprobs(batch: TrainBatch) -> list:
    """The student's logprobs of its sampled tokens for OPD: the batch's old logprobs when computed, else the
    engine's sampling logprobs (:func:`with_logprobs` computes old ones when a sample lacks them)."""
    if batch.old_logprobs is not None:
        return batch.old_logprobs
    return [torch.tensor(s.rollout_logprobs, dtype=torch.float32) for s in batch.samples]


def with_estimator_advantages(cfg, batch: TrainBatch) -> TrainBatch:
    """``batch`` with the configured estimator's advantages (and returns, with critic values)."""
    if batch.values is None:
        return batch.with_columns(advantages=compute_advantages(cfg, batch.samples, batch.rewards,
                                                                batch.old_logprobs, batch.ref_logprobs))
    advantages, returns = compute_advantages(cfg, batch.samples, batch.rewards, batch.old_logprobs,
                                             batch.ref_logprobs, values=batch.values, with_returns=True)
    return batch.with_columns(advantages=advantages, returns=returns)


def with_logprobs(cfg, trainer, batch: TrainBatch, critic=None) -> TrainBatch:
    """``batch`` with the old and ref logprobs and critic values the step needs. Old logprobs are recomputed
    only when the batch is not on-policy for every step (several optimizer steps per rollout, or --kl-coef);
    otherwise the training forward's own logprobs serve as the old ones."""
    samples = batch.samples
    old = ref = None
    if is_sft(cfg):   # the SFT loss reads the training forward's logprobs only
        return batch
    if cfg.use_opd and batch.teacher_logprobs is None:   # filled by the run's teacher (slick/train/opd_teacher.py)
        raise ValueError("--use-opd: the batch has no teacher_logprobs column (slick.loop.run.Run.score_teacher "
                         "fills it before training)")
    if cfg.use_rollout_logprobs:
        old = [torch.tensor(s.rollout_logprobs, dtype=torch.float32) for s in samples]
    elif cfg.num_steps_per_rollout > 1 or cfg.kl_coef:  # --kl-coef shapes rewards with old - ref
        old = trainer.compute_logprobs(samples, "actor")
    elif cfg.use_opd and any(len(s.rollout_logprobs) != len(s.response_ids) for s in samples):
        old = trainer.compute_logprobs(samples, "actor")   # OPD's student logprobs, where the engine gave none
    if trainer.has_ref:
        ref = trainer.compute_logprobs(samples, "ref")
    values = critic.compute_values(samples) if critic is not None else None
    return batch.with_columns(old_logprobs=old, ref_logprobs=ref, values=values)


def train_on_samples(cfg, trainer, samples, rewards: list[float], loss_fn, step: int,
                     critic=None) -> tuple[dict, dict]:
    """:func:`train_on_batch` on the batch of ``samples`` and their scalar ``rewards``. Returns (metrics, tensors)
    where tensors holds the per-sample advantages and old/ref logprobs (:func:`debug_tensors`)."""
    metrics, batch = train_on_batch(cfg, trainer, TrainBatch.from_samples(samples, rewards), loss_fn, step,
                                    critic=critic)
    return metrics, debug_tensors(batch)


def train_on_batch(cfg, trainer, batch: TrainBatch, loss_fn, step: int, critic=None) -> tuple[dict, TrainBatch]:
    """Compute advantages and run ``num_steps_per_rollout`` optimizer steps for rollout step ``step``.

    Returns (metrics, batch) where batch has gained its logprob, value, advantage and return columns.
    Metrics are averaged over the optimizer steps that were applied; ``train/skipped_steps`` and
    ``train/nonfinite_losses`` are summed. When every optimizer step was skipped (non-finite loss or
    gradient norm), raises :class:`NonFiniteTrainingError` naming the step.

    With a ``critic`` (PPO): its values for these samples (as trained) feed GAE, the critic takes
    --critic-num-steps-per-rollout steps on the returns (``slick.train.critic.train_critic``, ``critic/*``
    metrics), and during the first --num-critic-only-steps rollout steps the actor takes none.
    """
    t0 = time.perf_counter()
    batch = with_logprobs(cfg, trainer, batch, critic)
    t_logp = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = with_advantages(cfg, batch)
    opd = {} if batch.teacher_logprobs is None else opd_metrics(batch.teacher_logprobs, student_logprobs(batch),
                                                                batch.loss_mask)   # opd/kl, opd/*_logprob
    critic_metrics: dict = {}
    if critic is not None:
        critic_metrics = train_critic(cfg, critic, batch)
    actor_steps = cfg.num_steps_per_rollout
    if critic is not None and step < cfg.num_critic_only_steps:
        actor_steps = 0   # critic-only warm-up: the actor does not step
    applied: list[dict] = []
    counts = dict.fromkeys(COUNTS, 0.0)
    skipped_norms: list[float] = []
    gbs = optimizer_batch_size(cfg, len(batch))
    for k in range(actor_steps):
        part = batch.slice(k * gbs, (k + 1) * gbs)
        if not len(part):
            break
        part, part_loss = without_zero_gradients(cfg, loss_fn, part)
        m = trainer.train_step(part.samples, part.advantages, part_loss,
                               old_logprobs=part.old_logprobs, ref_logprobs=part.ref_logprobs)
        m["trained_samples"] = float(len(part))
        skipped = m["skipped_steps"] > 0
        for key in COUNTS:
            counts[key] += float(m.pop(key))
        if skipped:
            skipped_norms.append(m["grad_norm"])
        else:
            applied.append(m)
    if skipped_norms:
        _report_skipped(step, skipped_norms, len(applied), counts, batch)
    metrics: dict = {}   # each key's mean over the applied optimizer steps that report it
    for key in dict.fromkeys(k for m in applied for k in m):
        values = [float(m[key]) for m in applied if key in m]
        metrics[key] = sum(values) / len(values)
    out = {f"train/{k}": v for k, v in {**metrics, **counts}.items()}
    out.update(critic_metrics)
    out.update(opd)
    out["perf/logprob_time"] = t_logp  # extra forward passes (old / ref logprobs), when needed
    out["perf/train_time"] = time.perf_counter() - t0
    return out, batch


def without_zero_gradients(cfg, loss_fn, part: TrainBatch) -> tuple[TrainBatch, object]:
    """``part`` less its samples whose gradient is exactly zero (:func:`slick.algo.objective.zero_gradient`: e.g. a
    GRPO group whose samples all got the same reward), and the loss over the rest with the whole part's
    normalisers (:class:`WholeBatchLoss`): the same gradient without their forward and backward. ``part`` and
    ``loss_fn`` unchanged with --train-zero-advantage-samples, with a loss other than the built-in policy
    objective (a custom or SFT loss may read more than the advantages), or when nothing can be left out. When
    every sample's gradient is zero, none is left: the trainer steps on an exact zero gradient (weight decay,
    the moments' decay) as it would over the whole part."""
    builtin = isinstance(loss_fn, functools.partial) and loss_fn.func is compute_policy_objective
    if cfg.train_zero_advantage_samples or not builtin or part.advantages is None:
        return part, loss_fn
    params = loss_fn.args[0]
    keep = [i for i, a in enumerate(part.advantages) if not zero_gradient(params, a)]
    if len(keep) == len(part):
        return part, loss_fn
    num_tokens = sum(sum(loss_mask(s)) for s in part.samples)
    return part.select(keep), WholeBatchLoss(loss_fn, float(len(part)), float(num_tokens))


def _report_skipped(step: int, skipped_norms: list, applied: int, counts: dict, batch: TrainBatch) -> None:
    """Some optimizer steps of rollout step ``step`` were skipped (non-finite): a warning, or, when none was
    applied, :class:`NonFiniteTrainingError` (nothing changed, nothing will be synced or saved)."""
    what = f"non-finite loss in {counts['nonfinite_losses']:.0f} micro-batch(es), gradient norm(s) {skipped_norms}"
    if not applied:
        raise NonFiniteTrainingError(
            f"step {step}: training is non-finite: all {len(skipped_norms)} optimizer step(s) skipped "
            f"({what}); no weights changed and nothing was synced or saved. Check the rewards and "
            f"advantages of this step (--save-debug-train-data DIR writes them).", batch)
    log.warning("step %d: %d of %d optimizer step(s) skipped (%s); their gradients were dropped",
                step, len(skipped_norms), len(skipped_norms) + applied, what)

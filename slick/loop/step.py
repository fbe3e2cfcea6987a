"""One training phase of a step: a TrainBatch (slick.algo.batch) -> logprobs, values -> advantages (algo/)
-> optimizer steps (Trainer), each on a slice of the batch."""
from __future__ import annotations

import functools
import logging
import time

import torch

from slick.config import Config
from slick.algo.assemble import Advantages, student_logprobs
from slick.algo.batch import TrainBatch
from slick.algo.distill import opd_metrics
from slick.algo.objective import WholeBatchLoss, compute_policy_objective, zero_gradient
from slick.config.sft_distill import is_sft
from slick.train.critic import train_critic

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


def optimizer_batch_size(cfg: Config, num_samples: int) -> int:
    """Samples per optimizer step: --global-batch-size, or more when agent sessions that split into several
    samples made the batch larger than planned (the batch is then spread over the --num-steps-per-rollout steps)."""
    return max(cfg.global_batch_size, -(-num_samples // cfg.num_steps_per_rollout))


def with_logprobs(cfg: Config, trainer, batch: TrainBatch, critic=None) -> TrainBatch:
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


def train_on_samples(cfg: Config, trainer, samples, rewards: list[float], loss_fn, step: int,
                     critic=None) -> tuple[dict, dict]:
    """:func:`train_on_batch` on the batch of ``samples`` and their scalar ``rewards``. Returns (metrics, tensors)
    where tensors holds the per-sample advantages and old/ref logprobs (:func:`debug_tensors`)."""
    metrics, batch = train_on_batch(cfg, trainer, TrainBatch.from_samples(samples, rewards), loss_fn, step,
                                    critic=critic)
    return metrics, debug_tensors(batch)


def train_on_batch(cfg: Config, trainer, batch: TrainBatch, loss_fn, step: int, critic=None,
                   advantages: Advantages | None = None, postprocess=None) -> tuple[dict, TrainBatch]:
    """Compute advantages and run ``num_steps_per_rollout`` optimizer steps for rollout step ``step``.

    Returns (metrics, batch) where batch has gained its logprob, value, advantage and return columns.
    Metrics are averaged over the optimizer steps that were applied; ``train/skipped_steps`` and
    ``train/nonfinite_losses`` are summed. When every optimizer step was skipped (non-finite loss or
    gradient norm), raises :class:`NonFiniteTrainingError` naming the step.

    ``advantages``: the run's assembly (built once by ``slick.loop.build``; from ``cfg`` when not given).
    ``postprocess(batch, step) -> batch``: slime's --rollout-data-postprocess-path (slick/loop/slime_data.py), after
    the advantages and before any optimizer step.
    With a ``critic`` (PPO): its values for these samples (as trained) feed GAE, the critic takes
    --critic-num-steps-per-rollout steps on the returns (``slick.train.critic.train_critic``, ``critic/*``
    metrics), and during the first --num-critic-only-steps rollout steps the actor takes none.
    """
    t0 = time.perf_counter()
    batch = with_logprobs(cfg, trainer, batch, critic)
    t_logp = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = (advantages or Advantages.from_config(cfg))(batch)
    opd = {} if batch.teacher_logprobs is None else opd_metrics(batch.teacher_logprobs, student_logprobs(batch),
                                                                batch.loss_mask)   # opd/kl, opd/*_logprob
    if postprocess is not None:
        batch = postprocess(batch, step)
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
        m = trainer.train_step(part, part_loss)
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


def without_zero_gradients(cfg: Config, loss_fn, part: TrainBatch) -> tuple[TrainBatch, object]:
    """``part`` less its samples whose gradient is exactly zero (:func:`slick.algo.objective.zero_gradient`: e.g. a
    GRPO group whose samples all got the same reward), and the loss over the rest with the whole part's
    normalisers (:class:`WholeBatchLoss`): the same gradient without their forward and backward. ``part`` and
    ``loss_fn`` unchanged with --train-zero-advantage-samples, with a loss other than the built-in policy
    objective (a custom or SFT loss, or slime's loss hooks, may read more than the advantages), or when nothing
    can be left out. When
    every sample's gradient is zero, none is left: the trainer steps on an exact zero gradient (weight decay,
    the moments' decay) as it would over the whole part."""
    builtin = isinstance(loss_fn, functools.partial) and loss_fn.func is compute_policy_objective \
        and not loss_fn.keywords   # slime's loss hooks (slick/algo/slime_loss.py) may read the whole micro-batch
    if cfg.train_zero_advantage_samples or not builtin or part.advantages is None:
        return part, loss_fn
    params = loss_fn.args[0]
    keep = [i for i, a in enumerate(part.advantages) if not zero_gradient(params, a)]
    if len(keep) == len(part):
        return part, loss_fn
    num_tokens = sum(sum(m) for m in part.loss_mask)
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

"""PPO's critic: a :class:`~slick.train.trainer.Trainer` with the value head (``slick.train.heads.ValueHead``),
trained with the clipped value loss on the batch's returns.

The critic shares the trainer's machinery unchanged: packed micro-batches (``slick.train.packing``, prompt sharing
included), the precision schemes (``slick.train.precision``), FSDP2 ranks and their work split and gathers
(``slick.train.fsdp``, ``slick.proc.dist``), gradient clipping with ``--clip-grad`` and the skipped-step rules of
``optimizer_step``. What differs is the head's: the model (``AutoModel`` backbone of the checkpoint, no LM head,
plus ``Linear(hidden, 1)`` initialised to ZERO, weight and bias, so a fresh critic predicts 0 everywhere and its
first GAE equals the lambda-return), its learning rate (``--critic-lr``, warm-up ``--critic-lr-warmup-iters``),
its checkpoint format, and the loss (``slick.algo.value.value_loss``, here).

The value of response token ``j`` is read from the hidden state that predicts it (the state *before* the token,
row position ``offset + P - 1 + j`` of the packed row), i.e. ``V(s_t)`` for the state the token is sampled in.

One-process critic directory (``save``)::

    critic/
      backbone/               HF model dir of the backbone (AutoModel-loadable: config.json + safetensors)
      value_head.safetensors  head.weight [1, H], head.bias [1]
      optimizer.pt scheduler.pt trainer_state.json

Sharded (FSDP) critics write ``slick.ckpt.dcp``'s layout into the same directory.
"""
from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Callable, Optional

from slick.algo.batch import TrainBatch
from slick.algo.inputs import LossInputs
from slick.algo.value import explained_variance, value_loss
from slick.config import Config, ConfigView
from slick.train.heads import ValueHead
from slick.train.trainer import Trainer

# the train_step metrics train_critic reports (as critic/KEY, averaged over the applied steps)
CRITIC_METRICS = ("value_loss", "vf_clipfrac", "values_mean", "returns_mean", "lr", "grad_norm", "step_time")
log = logging.getLogger(__name__)


def needs_critic(cfg: Config | ConfigView) -> bool:
    """True when the run trains a critic (``--advantage-estimator ppo`` always does)."""
    return cfg.advantage_estimator == "ppo" and not cfg.debug_rollout_only


def _value_loss(clip: float, per_token: bool, inputs: LossInputs):
    """The value head's loss over one micro-batch: the head's ``values`` regress on the batch's ``returns``, clipped
    around the rollout's ``old_values``."""
    return value_loss(inputs.values, inputs.old_values, inputs.returns, inputs.mask, clip, per_token,
                      num_samples=inputs.num_samples, num_tokens=inputs.num_tokens)


def value_objective(cfg: Config) -> Callable:
    """The critic's ``loss_fn`` for the trainer's ``train_step``: the clipped value loss with ``--value-clip`` and
    ``--calculate-per-token-loss`` bound (a picklable partial: the Ray ranks receive it)."""
    return functools.partial(_value_loss, float(cfg.value_clip), bool(cfg.calculate_per_token_loss))


def Critic(cfg: Config | ConfigView, model_path: Optional[str] = None, precision: Optional[str] = None) -> Trainer:
    """The value model, its AdamW and warm-up: ``Trainer(cfg, head=ValueHead())``, collective over FSDP ranks like
    the policy's (same rules). Train it with ``train_step(batch, value_objective(cfg))``; metrics: the trainer's,
    with the value loss's value_loss, vf_clipfrac, values_mean, returns_mean (global-batch reductions)."""
    return Trainer(cfg, model_path, precision, head=ValueHead())


class CheckpointPair:
    """The trainer as checkpoints see it, with the critic in ``critic/`` of the same step directory: written inside
    the same temp dir + rename (``slick.ckpt.checkpoint``), restored with it. Everything else is the trainer's."""

    def __init__(self, trainer, critic):
        self.trainer, self.critic = trainer, critic

    def __getattr__(self, name):
        return getattr(self.trainer, name)

    def save(self, out_dir) -> None:
        self.trainer.save(out_dir)
        self.critic.save(str(Path(out_dir) / "critic"))

    def load(self, in_dir) -> None:
        d = Path(in_dir)
        if not (d / "critic").is_dir():
            raise FileNotFoundError(f"{d}: the checkpoint has no critic/ (saved by a run without "
                                    f"--advantage-estimator ppo); a PPO run resumes only from a PPO checkpoint")
        self.trainer.load(d)
        self.critic.load(str(d / "critic"))


def with_critic(trainer, critic):
    """``trainer``, or a :class:`CheckpointPair` of it and ``critic`` when the run has one."""
    return trainer if critic is None else CheckpointPair(trainer, critic)


def train_critic(cfg: Config, critic, batch: TrainBatch) -> dict:
    """``--critic-num-steps-per-rollout`` critic optimizer steps over ``batch`` (a ``slick.algo.batch.TrainBatch``
    with values and returns; consecutive equal slices), each with the clipped value loss against the returns around
    the rollout's values. Returns ``critic/*`` metrics: value_loss, vf_clipfrac, values_mean, returns_mean,
    grad_norm, lr averaged over the applied steps (skipped ones are counted in critic/skipped_steps), and
    critic/explained_variance of the values for the returns."""
    k = int(cfg.critic_num_steps_per_rollout or cfg.num_steps_per_rollout or 1)
    loss_fn = value_objective(cfg)
    size = -(-len(batch) // k)
    applied, skipped = [], 0.0
    for j in range(k):
        part = batch.slice(j * size, (j + 1) * size)
        if not len(part):
            break
        m = critic.train_step(part, loss_fn)
        s = float(m["skipped_steps"])
        skipped += s
        if s == 0:
            applied.append({key: m[key] for key in CRITIC_METRICS})
    if skipped:
        log.warning("critic: %d of %d optimizer step(s) skipped (non-finite value loss or gradient norm)",
                    int(skipped), int(skipped) + len(applied))
    out: dict = {}
    for m in applied:
        for key, v in m.items():
            out[f"critic/{key}"] = out.get(f"critic/{key}", 0.0) + float(v) / len(applied)
    out["critic/skipped_steps"] = skipped
    out["critic/explained_variance"] = float(explained_variance(batch.padded("values"), batch.padded("returns"),
                                                                batch.padded("loss_mask")))
    return out

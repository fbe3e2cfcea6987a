"""PPO's critic: a value model (the policy's backbone + a scalar head) trained with the clipped value loss.

The critic is a :class:`~slick.train.trainer.Trainer` whose forward returns one value per response token instead
of logprobs, so it shares the trainer's machinery unchanged: packed micro-batches (``slick.train.packing``, prompt
sharing included), the precision schemes (``slick.train.precision``), FSDP2 ranks and their work split and gathers
(``slick.train.fsdp``, ``slick.proc.dist``), gradient clipping with ``--clip-grad`` and the skipped-step rules of
``optimizer_step``. What differs: the model (``AutoModel`` backbone of the checkpoint, no LM head, plus
``Linear(hidden, 1)`` initialised to ZERO, weight and bias, so a fresh critic predicts 0 everywhere and its first
GAE equals the lambda-return), its own AdamW (``--critic-lr``, warm-up ``--critic-lr-warmup-iters``), the loss
(``slick.algo.value.value_loss``) and its checkpoint format.

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
import json
import logging
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from slick.algo.batch import TrainBatch
from slick.config import Config, ConfigView
from slick.algo.inputs import LossInputs
from slick.algo.value import explained_variance, value_loss
from slick.models.tokenizer import load_tokenizer
from slick.proc import dist as D
from slick.train.attention import use_segments
from slick.ckpt.dcp import is_sharded, load_sharded, save_sharded
from slick.train.fsdp import make_mesh, shard
from slick.train.optim import make_adamw
from slick.train.precision import resolve_device, resolve_dtype, resolve_scheme
from slick.ckpt.rng import rng_state, set_rng_state
from slick.ckpt.safe_load import load_pt   # weights_only=True: a checkpoint file runs no code
from slick.train.trainer import Trainer

HEAD_FILE = "value_head.safetensors"
# the train_step metrics train_critic reports (as critic/KEY, averaged over the applied steps)
CRITIC_METRICS = ("value_loss", "vf_clipfrac", "values_mean", "returns_mean", "lr", "grad_norm", "step_time")
log = logging.getLogger(__name__)


def needs_critic(cfg: Config | ConfigView) -> bool:
    """True when the run trains a critic (``--advantage-estimator ppo`` always does)."""
    return cfg.advantage_estimator == "ppo" and not cfg.debug_rollout_only


class ValueModel(nn.Module):
    """``forward(packed batch) -> (values [R], None)``: the packing forward of ``LogprobForward`` with a value head.

    The extra positional arguments (targets, temperature, chunk size, entropy flags) are those of the trainer's
    forward; the critic ignores them, so the trainer's micro-batch loops drive it unchanged.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear):
        super().__init__()
        self.backbone = backbone
        self.head = head

    @property
    def config(self):
        return self.backbone.config

    @property
    def generation_config(self):
        return None

    def forward(self, input_ids, position_ids, attention, gather_index, targets=None, temperature=1.0,
                chunk_size=0, with_entropy=False, entropy_grad=False):
        mask, segments = attention   # PackedBatch.attention()
        out = self.backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                            attention_mask=mask, slick_segments=segments)
        hidden = out.last_hidden_state[0].index_select(0, gather_index)
        return self.head(hidden).squeeze(-1).float(), None


def critic_source(path) -> tuple[Path, Optional[Path]]:
    """(backbone HF dir, value head file or None) of a ``--critic-load`` directory: an HF model dir, a critic dir
    slick wrote (``backbone/`` + ``value_head.safetensors``) or a checkpoint step dir holding ``critic/``."""
    d = Path(path)
    if (d / "critic").is_dir():
        d = d / "critic"
    if (d / HEAD_FILE).is_file() and (d / "backbone" / "config.json").is_file():
        return d / "backbone", d / HEAD_FILE
    if (d / "dcp").is_dir():
        raise ValueError(f"--critic-load {path}: a sharded (multi-rank) critic checkpoint cannot initialise a new "
                         f"critic; resume the run with --load instead")
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"--critic-load {path}: neither a Hugging Face model directory (config.json) nor "
                                f"a critic saved by slick (backbone/ + {HEAD_FILE})")
    return d, None


def _value_loss(clip: float, per_token: bool, inputs: LossInputs):
    """The value head's loss over one micro-batch: the head's ``values`` regress on the batch's ``returns``, clipped
    around the rollout's ``old_values``."""
    return value_loss(inputs.values, inputs.old_values, inputs.returns, inputs.mask, clip, per_token,
                      num_samples=inputs.num_samples, num_tokens=inputs.num_tokens)


def value_objective(cfg: Config) -> Callable:
    """The critic's ``loss_fn`` for the trainer's ``train_step``: the clipped value loss with ``--value-clip`` and
    ``--calculate-per-token-loss`` bound (a picklable partial: the Ray ranks receive it)."""
    return functools.partial(_value_loss, float(cfg.value_clip), bool(cfg.calculate_per_token_loss))


class Critic(Trainer):
    """The value model, its AdamW and warm-up; collective over FSDP ranks like the Trainer (same rules).

    A Trainer with the value head: the trainer's ``train_step`` (same signature, same micro-batch loop) with
    ``train_step(batch, value_objective(cfg))``, reading the batch's ``returns`` and ``values`` columns. Metrics:
    the trainer's, with the value loss's value_loss, vf_clipfrac, values_mean, returns_mean (global-batch
    reductions).
    """

    head = "value"
    CONFIG_GROUPS = ("train", "critic")

    def __init__(self, cfg: Config | ConfigView, model_path: Optional[str] = None, precision: Optional[str] = None):
        from transformers import AutoModel

        self.cfg = cfg = cfg.view(*self.CONFIG_GROUPS)
        self.model_path = str(model_path or cfg.critic_load or cfg.hf_checkpoint or "")
        if not self.model_path:
            raise ValueError("Critic needs a model: set --critic-load or --hf-checkpoint")
        backbone_dir, head_file = critic_source(self.model_path)
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        if precision is None and self.dtype != torch.float32:
            precision = cfg.train_precision
        self.scheme = resolve_scheme(self.dtype, precision)
        self.rank, self.world_size = D.world()
        self.fsdp = self.world_size > 1
        weight_dtype = torch.bfloat16 if self.scheme == "bf16" and not self.fsdp else torch.float32
        backbone = AutoModel.from_pretrained(str(backbone_dir), dtype=weight_dtype, attn_implementation="sdpa")
        use_segments(backbone)
        backbone.config.use_cache = False
        if cfg.gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        head = nn.Linear(backbone.config.hidden_size, 1, dtype=weight_dtype)
        with torch.no_grad():
            if head_file is None:   # a fresh critic predicts 0: its first GAE is the lambda-return
                head.weight.zero_()
                head.bias.zero_()
            else:
                from safetensors.torch import load_file

                saved = load_file(str(head_file))
                head.weight.copy_(saved["weight"])
                head.bias.copy_(saved["bias"])
        self.model = ValueModel(backbone, head).to(self.device)
        self.model.train()
        self.moe = None   # the value model's MoE blocks, if any, route by their own router (no replay)
        tok_dir = cfg.hf_checkpoint if cfg.hf_checkpoint and Path(cfg.hf_checkpoint).is_dir() else backbone_dir
        self.tokenizer = load_tokenizer(tok_dir)
        self.mesh = make_mesh(self.device) if self.fsdp else None
        if self.fsdp:
            with D.named_errors("sharding the critic"):
                self._fwd = shard(backbone, self.mesh, torch.bfloat16 if self.scheme == "bf16" else None,
                                  root=self.model)
        else:
            self._fwd = self.model
        self.param_names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if self.scheme == "bf16" and not self.fsdp:
            self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        else:
            self.master = self.params
        lr = cfg.critic_lr if cfg.critic_lr is not None else cfg.lr
        self.optimizer = make_adamw(self.master, cfg.train, lr)
        warm = int(cfg.critic_lr_warmup_iters or 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)
        self.version = 0
        self.skipped_steps = 0
        self.thread_budget = None
        self._nonfinite_losses = 0
        self.ref_model = None
        self._ref_fwd = None

    @property
    def has_ref(self) -> bool:
        return False

    def _forward(self, fwd, mb, with_entropy: bool, entropy_grad: bool):
        """Per-sample value lists for one packed micro-batch (the trainer's loops call this)."""
        mb = mb.to(self.device)
        with self._autocast():
            values, _ = fwd(mb.input_ids, mb.position_ids, mb.attention(), mb.gather_index, mb.targets)
        return list(values.split(mb.response_lengths)), None

    @torch.no_grad()
    def compute_values(self, samples: Sequence) -> list[torch.Tensor]:
        """fp32 CPU tensors ``[T_i]``: the critic's value at each response token of each sample."""
        return self.compute_logprobs(samples, "actor")   # the trainer's loop over this class's forward

    # ------------------------------------------------------------------ save / load
    def save_hf_files(self, out_dir) -> None:
        raise NotImplementedError("the critic is not exported as an HF model (`slick export` exports the actor)")

    def save(self, out_dir) -> None:
        """Weights (full precision), optimizer, scheduler and version into ``out_dir`` (layout in the module doc).
        Sharded: ``slick.ckpt.dcp``'s layout, collective. RNG states are the trainer's to save."""
        if self.fsdp:
            save_sharded(self, out_dir)
            return
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        sd = {k: v.float().contiguous().cpu() for k, v in self.full_precision_state_dict().items()}
        backbone = {k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")}
        dtype_before = self.model.backbone.config.dtype
        self.model.backbone.config.dtype = torch.float32
        try:
            self.model.backbone.save_pretrained(out / "backbone", state_dict=backbone)
        finally:
            self.model.backbone.config.dtype = dtype_before
        save_file({"weight": sd["head.weight"], "bias": sd["head.bias"]}, str(out / HEAD_FILE))
        torch.save(self.optimizer.state_dict(), out / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), out / "scheduler.pt")
        (out / "trainer_state.json").write_text(json.dumps(
            {"version": self.version, "scheme": self.scheme, "model_path": self.model_path, "kind": "critic"}))

    def load(self, in_dir) -> None:
        """Restore what :meth:`save` wrote (either layout, any number of ranks that wrote it). Collective when
        sharded. Does not touch the RNG state (the trainer's checkpoint restores it)."""
        from safetensors.torch import load_file

        d = Path(in_dir)
        if not (d / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{d}: not a critic checkpoint (trainer_state.json missing); was the run saved "
                                    f"without --advantage-estimator ppo?")
        if is_sharded(d):
            rng = rng_state()    # load_sharded restores the RNG files it finds; the trainer's load owns them
            load_sharded(self, d)
            set_rng_state(rng)
            return
        if self.fsdp:
            raise ValueError(f"{d}: a one-process critic checkpoint cannot be loaded by {self.world_size} critic "
                             f"ranks (resume with the same layout)")
        sd = {}
        for f in sorted((d / "backbone").glob("*.safetensors")):
            sd.update({f"backbone.{k}": v for k, v in load_file(str(f)).items()})
        sd.update({f"head.{k}": v for k, v in load_file(str(d / HEAD_FILE)).items()})
        master = dict(zip([id(p) for p in self.params], self.master))
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n not in sd:
                    raise KeyError(f"{d}: critic checkpoint lacks weight {n}")
                p.copy_(sd[n])
                if id(p) in master and master[id(p)] is not p:
                    master[id(p)].copy_(sd[n])

        self.optimizer.load_state_dict(load_pt(d / "optimizer.pt", map_location=self.device))
        self.scheduler.load_state_dict(load_pt(d / "scheduler.pt"))
        self.version = int(json.loads((d / "trainer_state.json").read_text())["version"])


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

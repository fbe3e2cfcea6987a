"""What a :class:`slick.train.trainer.Trainer` trains: the policy head or the value head, beside each other.

The trainer owns what every trained model shares: precision, FSDP2 ranks, packed micro-batches, AdamW, gradient
clipping and the skipped-step rules. A head owns what differs, and the trainer is built with one
(``Trainer(cfg, head=...)``):

* :class:`PolicyHead`: the causal LM (PEFT LoRA, slick's fused decoder layers, MoE routing replay), whose
  forward gives each response token's logprob and entropy at the rollout temperature; a frozen reference and
  teacher beside it; HF export; checkpoints by ``slick.train.trainer_io``.
* :class:`ValueHead`: PPO's value model, the checkpoint's ``AutoModel`` backbone plus ``Linear(hidden, 1)``
  initialised to zero (a fresh critic predicts 0, so its first GAE is the lambda-return); its own learning rate
  (``--critic-lr``, warm-up ``--critic-lr-warmup-iters``); its own checkpoint layout (``slick.train.critic``).

A head's ``load`` returns a :class:`Loaded` model; the trainer shards it (``shard_parts``) or runs it in one
process (``local_forward``) and calls ``forward`` per micro-batch.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from slick.ckpt.dcp import is_sharded, load_sharded, save_sharded
from slick.ckpt.rng import rng_state, set_rng_state
from slick.ckpt.safe_load import load_pt   # weights_only=True: a checkpoint file runs no code
from slick.config import Config, ConfigView
from slick.models.tokenizer import load_tokenizer
from slick.proc.memory import own_memory
from slick.train.attention import use_segments
from slick.train.fsdp import LogprobForward, decoder_layers
from slick.train.fused_layers import FUSED_LAYERS, fuse_decoder_layers
from slick.train.lora import attach_lora
from slick.train.lr import lr_factor_from_config
from slick.train.moe import use_slick_moe
from slick.train import trainer_io

HEAD_FILE = "value_head.safetensors"


@dataclass
class Loaded:
    """A head's model as loaded: ``model`` holds the trained parameters; ``shard_parts`` is what FSDP2 wraps
    (``(module, root)``: root None shards ``module`` as its own root)."""

    model: nn.Module
    tokenizer: Any
    model_path: str
    lora: Any = None              # slick.train.lora.PolicyLora (policy with --lora-rank / --lora-load)
    fused_layers: int = 0
    moe: Any = None               # slick.train.moe's MoE blocks (routing replay), policy only
    shard_parts: tuple = ()


def _checkpointing(model: nn.Module, on: bool) -> None:
    if not on:
        return
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


class PolicyHead:
    """The policy: logprobs (and entropy) per response token. See the module doc."""

    name = "policy"
    CONFIG_GROUPS = ("train", "algorithm", "rollout", "lora", "sft_distill")

    def model_path(self, cfg: Config | ConfigView, override: Optional[str]) -> str:
        return policy_model_dir(override or cfg.hf_checkpoint)

    def weight_dtype(self, cfg: Config | ConfigView, dtype: torch.dtype) -> Optional[torch.dtype]:
        """LoRA: the frozen base in the compute dtype (fp32 adapters under autocast); else the scheme's."""
        return dtype if (cfg.lora_rank or cfg.lora_load) else None

    def load(self, cfg: Config | ConfigView, path: str, weight_dtype: torch.dtype, device: torch.device) -> Loaded:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=weight_dtype, attn_implementation="sdpa").to(device)
        own_memory(p for p in model.parameters() if p.requires_grad)   # not the file's pages (proc/memory.py)
        use_segments(model)
        lora = attach_lora(model, cfg, path)   # PEFT adapters (slick.train.lora) or None
        fused = 0 if cfg.disable_fused_layers or lora else fuse_decoder_layers(decoder_layers(model),
                                                                                recompute_mlp=cfg.recompute_mlp)
        if cfg.recompute_mlp and not fused:
            raise ValueError(f"--recompute-mlp: none of {path}'s decoder layers can be fused "
                             f"(supported: {', '.join(FUSED_LAYERS)}); use --gradient-checkpointing")
        moe = use_slick_moe(model, cfg.use_routing_replay)   # slick's MoE blocks (train/moe.py) or None
        model.config.use_cache = False
        model.train()
        _checkpointing(model, cfg.gradient_checkpointing)
        return Loaded(model, load_tokenizer(path), path, lora=lora, fused_layers=fused, moe=moe,
                      shard_parts=(model, None))

    def local_forward(self, loaded: Loaded) -> nn.Module:
        return LogprobForward(loaded.model)

    def lr(self, cfg: Config | ConfigView) -> float:
        return cfg.lr

    def lr_factor(self, cfg: Config | ConfigView) -> Callable[[int], float]:
        return lr_factor_from_config(cfg)   # train/lr.py

    def forward(self, tr, fwd, mb, with_entropy: bool, entropy_grad: bool):
        """Per-sample (logprobs, entropy) lists of one packed micro-batch (``fwd``: the FSDP root if sharded)."""
        replay = tr.moe.replaying(mb.routing) if tr.moe is not None else contextlib.nullcontext()
        with tr._autocast(), replay:
            lp, ent = fwd(mb.input_ids, mb.position_ids, mb.attention(), mb.gather_index, mb.targets,
                          float(tr.cfg.rollout_temperature), tr.cfg.logprob_chunk_size, with_entropy, entropy_grad)
        return list(lp.split(mb.response_lengths)), (list(ent.split(mb.response_lengths)) if ent is not None
                                                      else None)

    def has_ref(self, cfg: Config | ConfigView) -> bool:
        """True when a KL term needs the frozen reference model."""
        return bool((cfg.use_kl_loss and cfg.kl_loss_coef > 0) or cfg.kl_coef > 0)

    def save(self, tr, out_dir) -> None:
        trainer_io.save(tr, out_dir)

    def load_state(self, tr, in_dir) -> None:
        trainer_io.load(tr, in_dir)

    def save_hf_files(self, tr, out_dir) -> None:
        trainer_io.save_hf_files(tr, out_dir)


class ValueModel(nn.Module):
    """``forward(packed batch) -> (values [R], None)``: the packing forward of ``LogprobForward`` with a value head.

    The extra positional arguments (targets, temperature, chunk size, entropy flags) are those of the trainer's
    forward; the value model ignores them.
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


class ValueHead:
    """PPO's value model: one value per response token. See the module doc."""

    name = "value"
    CONFIG_GROUPS = ("train", "critic")

    def model_path(self, cfg: Config | ConfigView, override: Optional[str]) -> str:
        path = str(override or cfg.critic_load or cfg.hf_checkpoint or "")
        if not path:
            raise ValueError("Critic needs a model: set --critic-load or --hf-checkpoint")
        return path

    def weight_dtype(self, cfg: Config | ConfigView, dtype: torch.dtype) -> Optional[torch.dtype]:
        return None

    def load(self, cfg: Config | ConfigView, path: str, weight_dtype: torch.dtype, device: torch.device) -> Loaded:
        from transformers import AutoModel

        backbone_dir, head_file = critic_source(path)
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
        model = ValueModel(backbone, head).to(device)
        model.train()
        tok_dir = cfg.hf_checkpoint if cfg.hf_checkpoint and Path(cfg.hf_checkpoint).is_dir() else backbone_dir
        return Loaded(model, load_tokenizer(tok_dir), path, shard_parts=(backbone, model))

    def local_forward(self, loaded: Loaded) -> nn.Module:
        return loaded.model

    def lr(self, cfg: Config | ConfigView) -> float:
        return cfg.critic_lr if cfg.critic_lr is not None else cfg.lr

    def lr_factor(self, cfg: Config | ConfigView) -> Callable[[int], float]:
        warm = int(cfg.critic_lr_warmup_iters or 0)
        return lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0

    def forward(self, tr, fwd, mb, with_entropy: bool, entropy_grad: bool):
        """Per-sample value lists of one packed micro-batch."""
        with tr._autocast():
            values, _ = fwd(mb.input_ids, mb.position_ids, mb.attention(), mb.gather_index, mb.targets)
        return list(values.split(mb.response_lengths)), None

    def has_ref(self, cfg: Config | ConfigView) -> bool:
        return False

    def save_hf_files(self, tr, out_dir) -> None:
        raise NotImplementedError("the critic is not exported as an HF model (`slick export` exports the actor)")

    def save(self, tr, out_dir) -> None:
        """Weights (full precision), optimizer, scheduler and version into ``out_dir`` (``critic/``'s layout in
        slick.train.critic). Sharded: ``slick.ckpt.dcp``'s layout, collective. RNG states are the policy's."""
        if tr.fsdp:
            save_sharded(tr, out_dir)
            return
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        sd = {k: v.float().contiguous().cpu() for k, v in tr.full_precision_state_dict().items()}
        backbone = {k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")}
        dtype_before = tr.model.backbone.config.dtype
        tr.model.backbone.config.dtype = torch.float32
        try:
            tr.model.backbone.save_pretrained(out / "backbone", state_dict=backbone)
        finally:
            tr.model.backbone.config.dtype = dtype_before
        save_file({"weight": sd["head.weight"], "bias": sd["head.bias"]}, str(out / HEAD_FILE))
        torch.save(tr.optimizer.state_dict(), out / "optimizer.pt")
        torch.save(tr.scheduler.state_dict(), out / "scheduler.pt")
        (out / "trainer_state.json").write_text(json.dumps(
            {"version": tr.version, "scheme": tr.scheme, "model_path": tr.model_path, "kind": "critic"}))

    def load_state(self, tr, in_dir) -> None:
        """Restore what :meth:`save` wrote (either layout, any number of ranks that wrote it). Collective when
        sharded. Does not touch the RNG state (the policy's checkpoint restores it)."""
        from safetensors.torch import load_file

        d = Path(in_dir)
        if not (d / "trainer_state.json").is_file():
            raise FileNotFoundError(f"{d}: not a critic checkpoint (trainer_state.json missing); was the run saved "
                                    f"without --advantage-estimator ppo?")
        if is_sharded(d):
            rng = rng_state()    # load_sharded restores the RNG files it finds; the policy's load owns them
            load_sharded(tr, d)
            set_rng_state(rng)
            return
        if tr.fsdp:
            raise ValueError(f"{d}: a one-process critic checkpoint cannot be loaded by {tr.world_size} critic "
                             f"ranks (resume with the same layout)")
        sd = {}
        for f in sorted((d / "backbone").glob("*.safetensors")):
            sd.update({f"backbone.{k}": v for k, v in load_file(str(f)).items()})
        sd.update({f"head.{k}": v for k, v in load_file(str(d / HEAD_FILE)).items()})
        master = dict(zip([id(p) for p in tr.params], tr.master))
        with torch.no_grad():
            for n, p in tr.model.named_parameters():
                if n not in sd:
                    raise KeyError(f"{d}: critic checkpoint lacks weight {n}")
                p.copy_(sd[n])
                if id(p) in master and master[id(p)] is not p:
                    master[id(p)].copy_(sd[n])
        tr.optimizer.load_state_dict(load_pt(d / "optimizer.pt", map_location=tr.device))
        tr.scheduler.load_state_dict(load_pt(d / "scheduler.pt"))
        tr.version = int(json.loads((d / "trainer_state.json").read_text())["version"])


def policy_model_dir(path) -> str:
    """The policy's HF directory, which must exist (ValueError / FileNotFoundError naming --hf-checkpoint)."""
    if not path:
        raise ValueError("Trainer needs a model: pass model_path or set --hf-checkpoint")
    if not Path(path).is_dir():
        raise FileNotFoundError(f"--hf-checkpoint: model directory not found: {path}")
    return str(path)

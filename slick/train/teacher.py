"""The frozen teacher of on-policy distillation (``--use-opd --opd-type trainer``) and the tokenizer check.

The teacher is loaded beside the policy in every trainer process, like the reference model: its own dtype
(bf16 where the trainer computes in bf16), evaluation mode, no gradients, sharded like the policy under FSDP2,
never updated. ``Trainer.compute_logprobs(samples, "teacher")`` runs it on the student's sampled tokens.
"""
from __future__ import annotations

from typing import Optional

import torch

from slick.models.tokenizer import load_tokenizer
from slick.train import dist as D
from slick.train.attention import use_segments
from slick.train.fsdp import LogprobForward, decoder_layers, shard
from slick.train.fused_layers import fuse_decoder_layers


class TokenizerMismatch(ValueError):
    """Teacher and student tokenize differently: the teacher cannot score the student's token ids."""


def wants_teacher(cfg) -> bool:
    """Whether the trainer loads a teacher: --use-opd with a trainer-side teacher."""
    return bool(getattr(cfg, "use_opd", False)) and getattr(cfg, "opd_type", "trainer") in ("trainer", "megatron")


def check_same_tokenizer(student_path: str, teacher_path: str) -> None:
    """Raise :class:`TokenizerMismatch` naming both directories unless their tokenizers map every token string
    to the same id and share the special tokens (EOS, BOS, PAD)."""
    s, t = load_tokenizer(student_path), load_tokenizer(teacher_path)
    sv, tv = s.get_vocab(), t.get_vocab()
    where = f"student --hf-checkpoint {student_path} and teacher --opd-teacher-load {teacher_path}"
    if sv != tv:
        diff = sorted(set(sv.items()) ^ set(tv.items()), key=lambda kv: kv[1])[:3]
        raise TokenizerMismatch(f"{where} have different tokenizers ({len(sv)} vs {len(tv)} tokens; e.g. "
                                f"{diff}): on-policy distillation needs one tokenizer")
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if getattr(s, name) != getattr(t, name):
            raise TokenizerMismatch(f"{where}: {name} {getattr(s, name)} vs {getattr(t, name)}: on-policy "
                                    "distillation needs one tokenizer")


def load_teacher(trainer) -> Optional[LogprobForward]:
    """The teacher's logprob forward for ``trainer`` (its cfg, device, dtype, mesh), or None without one."""
    cfg = trainer.cfg
    if not wants_teacher(cfg):
        return None
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if trainer.dtype == torch.bfloat16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(cfg.opd_teacher_load, dtype=dtype,
                                                 attn_implementation="sdpa").to(trainer.device)
    use_segments(model)
    if not cfg.disable_fused_layers:
        fuse_decoder_layers(decoder_layers(model))
    model.config.use_cache = False
    model.eval().requires_grad_(False)
    trainer.teacher_model = model
    if trainer.fsdp:
        with D.named_errors("sharding the teacher model"):
            return shard(model, trainer.mesh)
    return LogprobForward(model)

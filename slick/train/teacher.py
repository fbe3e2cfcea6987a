"""The frozen teacher of on-policy distillation (``--use-opd --opd-type trainer``) and the tokenizer check.

The teacher is loaded beside the policy in every trainer process, like the reference model: its own dtype
(bf16 where the trainer computes in bf16), evaluation mode, no gradients, sharded like the policy under FSDP2,
never updated. ``Trainer.compute_logprobs(samples, "teacher")`` runs it on the student's sampled tokens.
"""
from __future__ import annotations

from slick.config import Config, ConfigView
from slick.models.tokenizer import load_tokenizer
from slick.train.frozen import load_frozen


class TokenizerMismatch(ValueError):
    """Teacher and student tokenize differently: the teacher cannot score the student's token ids."""


def wants_teacher(cfg: Config | ConfigView) -> bool:
    """Whether the trainer loads a teacher: --use-opd with a trainer-side teacher (reads the sft_distill group)."""
    return bool(cfg.use_opd) and cfg.opd_type in ("trainer", "megatron")


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


def load_teacher(trainer):
    """``(teacher model, its logprob forward)`` for ``trainer`` (``slick.train.frozen``), or ``(None, None)``
    without ``--use-opd`` and a trainer-side teacher."""
    if not wants_teacher(trainer.cfg):
        return None, None
    return load_frozen(trainer.cfg.opd_teacher_load, trainer, "the teacher model")

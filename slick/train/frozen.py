"""Frozen models beside the policy: the reference of the KL terms and the teacher of on-policy distillation.

Each is its checkpoint loaded in the trainer's compute dtype (bf16 where the trainer computes in bf16, else fp32),
in evaluation mode without gradients, with the fused decoder layers unless ``--disable-fused-layers``, and sharded
like the policy under FSDP2. Nothing updates it.
"""
from __future__ import annotations

import torch

from slick.proc import dist as D
from slick.train.attention import use_segments
from slick.train.fsdp import LogprobForward, decoder_layers, shard
from slick.train.fused_layers import fuse_decoder_layers


def load_frozen(path: str, trainer, what: str):
    """``(model, logprob forward)`` of the HF checkpoint at ``path`` for ``trainer`` (its cfg, device, dtype and
    mesh); ``what`` ("the reference model") names it in a sharding error."""
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if trainer.dtype == torch.bfloat16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(trainer.device)
    use_segments(model)
    if not trainer.cfg.disable_fused_layers:
        fuse_decoder_layers(decoder_layers(model))
    model.config.use_cache = False
    model.eval().requires_grad_(False)
    if not trainer.fsdp:
        return model, LogprobForward(model)
    with D.named_errors(f"sharding {what}"):
        return model, shard(model, trainer.mesh)

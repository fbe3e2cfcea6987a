"""FSDP2 sharding of the trainer's models, and the forward module that is the FSDP root.

Layout (``shard``): ``fully_shard`` on every decoder layer, then on a :class:`LogprobForward` wrapper around
the HF causal LM as the root. The root owns what the layers do not (embeddings, final norm, lm head, tied
or not); its forward runs the whole packed forward + chunked logprob/entropy computation, so FSDP's root
hooks unshard those parameters for exactly the span where they are used. Calling ``lm.base_model(...)``
or the lm head directly on a sharded model would bypass the root's hooks and see sharded DTensors.

Precision (see ``docs/training.md``): parameters are sharded in fp32 (the master weights). ``--train-precision
bf16`` maps to ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: layers all-gather bf16
weights, forward/backward run in bf16, gradients are reduce-scattered in fp32 and accumulated into the fp32
shards that AdamW updates. ``autocast`` (the bf16 default) keeps fp32 all-gathers and runs the forward under
``torch.autocast(bf16)``, exactly as in one process. fp32 runs have no policy.

Gradients are SUMMED over ranks (``set_gradient_divide_factor(1.0)``): each rank's loss already uses the
global batch normalisers, so the sum over ranks is the one-process gradient.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from slick.train.logprobs import chunked_logprobs


class LogprobForward(nn.Module):
    """``forward(packed batch) -> (logprobs [R], entropy [R] | None)`` for a HF causal LM ``lm``."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, position_ids, attention, gather_index, targets, temperature: float,
                chunk_size: int, with_entropy: bool, entropy_grad: bool):
        lm = self.lm
        mask, segments = attention   # PackedBatch.attention()
        out = lm.base_model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                            attention_mask=mask, slick_segments=segments)
        hidden = out.last_hidden_state[0].index_select(0, gather_index)
        return chunked_logprobs(hidden, lm.get_output_embeddings(), targets, temperature, chunk_size,
                                with_entropy, entropy_grad, getattr(lm.config, "final_logit_softcapping", None))


def decoder_layers(lm: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF causal LM (``lm.base_model.layers``; ``h`` / ``blocks`` for others)."""
    base = lm.base_model
    for attr in ("layers", "h", "blocks"):
        layers = getattr(base, attr, None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return list(layers)
    raise ValueError(f"{type(lm).__name__}: cannot find its decoder layers (looked for base_model.layers/h/"
                     "blocks); FSDP sharding needs them")


def make_mesh(device: torch.device):
    """A 1-D device mesh over every rank of the default group (cpu for gloo, cuda for nccl)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (torch.distributed.get_world_size(),))


def shard(lm: nn.Module, mesh, param_dtype: Optional[torch.dtype] = None, root: Optional[nn.Module] = None):
    """Shard ``lm`` in place (per decoder layer, then the root) and return the root :class:`LogprobForward`.

    ``param_dtype=torch.bfloat16`` installs ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``.
    ``root``: another module holding ``lm`` to be the root (the critic's value model, ``slick.train.critic``).
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    kw = {"mesh": mesh}
    if param_dtype is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(lm):
        fully_shard(layer, **kw)
    root = LogprobForward(lm) if root is None else root
    fully_shard(root, **kw)
    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)   # sum over ranks: the loss carries the global normalisers
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return root


def reshard(root: nn.Module) -> None:
    """Shard every FSDP module under ``root`` again (local, no collective). A forward without backward leaves the
    root's parameters gathered (FSDP2 keeps the root unsharded after forward for the backward it expects): its
    ``named_parameters`` are then plain tensors whose storage a later reshard frees, not DTensors."""
    from torch.distributed.fsdp import FSDPModule

    for m in root.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a (possibly sharded) DTensor; collective for DTensors."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global 2-norm of (possibly sharded) gradients; collective for DTensors, same value on every rank."""
    norm = torch.nn.utils.get_total_norm(grads)
    return full_tensor(norm)

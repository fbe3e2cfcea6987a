"""LoRA (PEFT) policies on FSDP2 ranks: merged weights for the engines, and checkpoints in PEFT's format.

The trainer wraps its causal LM with PEFT's LoRA layers (``slick.train.lora``) *before* sharding, then shards it
as any policy (``slick.train.fsdp.shard``: ``fully_shard`` per decoder layer, then the root). Each FSDP2
parameter group then holds frozen base weights (the compute dtype) beside trainable fp32 adapters: FSDP2 shards
per parameter, gathers mixed dtypes in one all-gather, and needs a uniform dtype only among the *trainable*
parameters of a group (the adapters: fp32). Only the adapters get gradients (reduce-scattered, summed over ranks)
and AdamW state; the frozen base has neither.

What a sharded LoRA trainer needs beyond a full-weight one, all collective (every rank calls, in the same order):

* :func:`adapter_payload`: the adapters alone, gathered, for engines that merge them on arrival.
* :func:`merged_weights` / :func:`merged_state_dict`: every FSDP module all-gathers its parameters
  (:func:`unsharded`), PEFT merges ``W + B @ A * alpha / r`` exactly as in one process, and the copies outlive the
  gather: what the engines receive and what ``--save-hf`` writes.
* :func:`save_lora`: the checkpoint of a one-process LoRA trainer, byte for byte the same layout
  (``adapter/`` in PEFT's format, ``optimizer.pt`` with full tensors, ``scheduler.pt``, ``rng.pt``,
  ``trainer_state.json``), gathered and written by rank 0, plus each rank's RNG state under ``rng/``. So a
  checkpoint of N ranks resumes with M (:func:`load_lora`: every rank reads the files and keeps its shard).
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from slick.proc import dist as D
from slick.ckpt.dcp import load_legacy_sharded
from slick.train.fsdp import full_tensor
from slick.models.adapter_check import ADAPTER
from slick.train.lora_spec import read_adapter_config
from slick.ckpt.rng import read_rng_file, rng_state, save_rng_file, set_rng_state

PEFT_PREFIX = "base_model.model."   # PeftModel's names of the wrapped model's parameters


def peft_key(name: str) -> str:
    """The key of a policy parameter (``model.layers.0.self_attn.q_proj.lora_A.default.weight``) in PEFT's
    adapter file (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")


@contextlib.contextmanager
def unsharded(root: torch.nn.Module) -> Iterator[None]:
    """Inside: every FSDP module under ``root`` holds its full parameters (one all-gather each); after: sharded
    again and the gathered storage freed (so a tensor that must outlive the block is copied inside it)."""
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in root.modules() if isinstance(m, FSDPModule)]
    with D.named_errors("all-gathering the LoRA policy's parameters"):
        for m in mods:
            m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()


def merged_weights(tr) -> list[tuple[str, torch.Tensor]]:
    """``tr.lora.merged_weights()`` of a sharded trainer ``tr``: full HF-named tensors, adapters merged."""
    with unsharded(tr._fwd):
        return [(n, t.clone()) for n, t in tr.lora.merged_weights()]


def adapter_payload(tr):
    """``tr.lora.adapter_payload()`` of a sharded trainer ``tr``: the adapters all-gathered (a few MiB), copied to
    the CPU (what a rank's weight transport sends alone to engines that merge it: ``slick.weights.lora_sync``)."""
    p = tr.lora.adapter_payload()               # DTensor shards (FSDP2's state dict), in the same order on every rank
    with D.named_errors("all-gathering the LoRA adapters"):
        return type(p)(p.config, {n: full_tensor(t).cpu() for n, t in p.tensors.items()})


def merged_state_dict(tr) -> dict[str, torch.Tensor]:
    """``tr.lora.merged_state_dict()`` of a sharded trainer ``tr`` (fp32 weights, adapters merged, buffers)."""
    with unsharded(tr._fwd):
        return {n: t.clone() for n, t in tr.lora.merged_state_dict().items()}


def _full_optimizer_state(tr) -> dict:
    """``tr.optimizer.state_dict()`` with every sharded tensor gathered: the one-process layout (collective)."""
    sd = tr.optimizer.state_dict()
    with D.named_errors("gathering the adapters' optimizer state"):
        state = {i: {k: full_tensor(v).cpu() if torch.is_tensor(v) else v for k, v in st.items()}
                 for i, st in sd["state"].items()}
    return {"state": state, "param_groups": sd["param_groups"]}


def _rank_rng(d: Path, rank: int) -> Path:
    return d / "rng" / f"rank_{rank:05d}.pt"


def save_lora(tr, out_dir) -> None:
    """Collective: the LoRA checkpoint of sharded trainer ``tr`` in ``out_dir`` (module doc), rank 0 writing."""
    out = Path(out_dir)
    with D.named_errors("gathering the adapters"):
        adapter = {peft_key(n): full_tensor(p.detach()).float().cpu().contiguous()
                   for n, p in zip(tr.param_names, tr.params)}
    optim = _full_optimizer_state(tr)
    if tr.rank == 0:
        (out / "rng").mkdir(parents=True, exist_ok=True)
        (out / "trainer_state.json").unlink(missing_ok=True)   # incomplete until written again below
        tr.lora.peft.save_pretrained(str(out / "adapter"), selected_adapters=[ADAPTER], state_dict=adapter)
        torch.save(optim, out / "optimizer.pt")
        torch.save(tr.scheduler.state_dict(), out / "scheduler.pt")
        torch.save(rng_state(), out / "rng.pt")
    D.barrier(f"save {out}: adapter written")
    save_rng_file(_rank_rng(out, tr.rank))
    D.barrier(f"save {out}: every rank's RNG state written")
    if tr.rank == 0:
        (out / "trainer_state.json").write_text(json.dumps(
            {"version": tr.version, "scheme": tr.scheme, "model_path": tr.model_path, "world_size": tr.world_size}))
    D.barrier(f"save {out}: marker written")


def load_lora(tr, d: Path) -> None:
    """Collective: restore sharded trainer ``tr`` from a LoRA checkpoint written by any number of ranks."""
    from safetensors.torch import load_file

    conf = read_adapter_config(d / "adapter")
    spec = tr.lora.spec
    if int(conf["r"]) != spec.rank or float(conf.get("lora_alpha") or 0) != spec.alpha:
        raise ValueError(f"{d / 'adapter'}: adapter has rank {conf['r']}, alpha {conf.get('lora_alpha')}; this run "
                         f"trains rank {spec.rank}, alpha {spec.alpha:g}")
    saved = load_file(str(d / "adapter" / "adapter_model.safetensors"))
    want = {peft_key(n): n for n in tr.param_names}
    if set(saved) != set(want):
        raise ValueError(f"{d / 'adapter'}: adapter weights do not match this run's adapters (e.g. "
                         f"{sorted(set(saved) ^ set(want))[:3]}); same --lora-target-modules?")
    load_legacy_sharded(tr, d, {n: saved[k] for k, n in want.items()})   # every rank keeps its shard
    own = _rank_rng(d, tr.rank)
    if own.is_file():   # this rank's own stream (dropout), when the writer had this rank
        set_rng_state(read_rng_file(own))

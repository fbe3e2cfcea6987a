"""A trainer's weights and checkpoint files: :meth:`slick.train.trainer.Trainer.save` / ``load`` /
``save_hf_files``, and ``named_weights`` / ``full_precision_state_dict`` (what a weight sync and a save read).

One process writes a full HF directory under ``model/`` (a LoRA trainer: PEFT's ``adapter/`` only, the base is
``--hf-checkpoint``), ``optimizer.pt``, ``scheduler.pt``, ``rng.pt`` and ``trainer_state.json`` (last). Sharded
trainers write a ``torch.distributed.checkpoint`` directory (``slick.ckpt.dcp``; LoRA: the one-process layout,
gathered by ``slick.train.fsdp_lora``). Every format loads with any number of ranks; ``.pt`` files load with
``weights_only=True`` (``slick.ckpt.safe_load``): a checkpoint runs no code.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

import torch

from slick.models.safetensors_header import read_header
from slick.proc import dist as D
from slick.train import fsdp_lora
from slick.train.fsdp import full_tensor
from slick.ckpt.dcp import (is_sharded, load_legacy_sharded, load_sharded, number_groups, save_sharded,
                             write_hf_dir)
from slick.train.moe import fuse_expert_weights
from slick.ckpt.rng import read_rng_file, rng_state, set_rng_state
from slick.ckpt.safe_load import load_pt


def save_hf_files(tr, out_dir) -> None:
    """Write a loadable HF directory (weights at full precision, config, generation config, tokenizer).
    Sharded: collective; rank 0 writes."""
    out = Path(out_dir)
    sd = {k: v.float().contiguous().cpu() if v.is_floating_point() else v.cpu()
          for k, v in tr.full_precision_state_dict().items()}
    if tr.fsdp:
        if tr.rank == 0:
            write_hf_dir(out, tr.model.config, sd, tr.tokenizer)
        D.barrier("save_hf_files")
        return
    out.mkdir(parents=True, exist_ok=True)
    dtype_before = tr.model.config.dtype
    tr.model.config.dtype = torch.float32
    try:
        tr.model.save_pretrained(out, state_dict=sd)
    finally:
        tr.model.config.dtype = dtype_before
    tr.tokenizer.save_pretrained(out)


def save(tr, out_dir) -> None:
    """Model (or adapter), optimizer, scheduler, RNG states and version of trainer ``tr`` into ``out_dir``."""
    if tr.fsdp:   # LoRA: the one-process layout, gathered on rank 0 (slick.train.fsdp_lora)
        (fsdp_lora.save_lora if tr.lora is not None else save_sharded)(tr, out_dir)
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tr.lora is not None:   # the adapter alone, in PEFT's format (the base is --hf-checkpoint)
        tr.lora.save_adapter(out / "adapter")
    else:
        save_hf_files(tr, out / "model")
    torch.save(tr.optimizer.state_dict(), out / "optimizer.pt")
    torch.save(tr.scheduler.state_dict(), out / "scheduler.pt")
    torch.save(rng_state(), out / "rng.pt")   # tensors and plain data: loads with weights_only=True
    (out / "trainer_state.json").write_text(json.dumps(
        {"version": tr.version, "scheme": tr.scheme, "model_path": tr.model_path}))

def load(tr, in_dir) -> None:
    """Restore into trainer ``tr`` everything :func:`save` wrote, in either format, whatever the number of ranks
    that wrote it (the model architecture must match). Collective when sharded."""
    d = Path(in_dir)
    if not (d / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{d}: not a trainer checkpoint (trainer_state.json missing)")
    if is_sharded(d):
        load_sharded(tr, d)
        return
    if tr.lora is not None or (d / "adapter").is_dir():
        _load_adapter(tr, d)
        return
    sd = _read_legacy_weights(tr, d)
    if tr.fsdp:
        load_legacy_sharded(tr, d, sd)
        return
    names = dict(tr.model.named_parameters())
    master = dict(zip([id(p) for p in tr.params], tr.master))
    with torch.no_grad():
        for n, p in names.items():
            p.copy_(sd[n])
            if id(p) in master and master[id(p)] is not p:
                master[id(p)].copy_(sd[n])

    opt = load_pt(d / "optimizer.pt", map_location=tr.device)
    tr.optimizer.load_state_dict({**opt, "param_groups": number_groups(opt["param_groups"], tr.optimizer, d)})
    tr.scheduler.load_state_dict(load_pt(d / "scheduler.pt"))
    set_rng_state(read_rng_file(d / "rng.pt"))
    tr.version = int(json.loads((d / "trainer_state.json").read_text())["version"])

def _load_adapter(tr, d: Path) -> None:
    """Restore a LoRA checkpoint (``adapter/`` + optimizer, scheduler, RNG, version) into a LoRA trainer."""
    if tr.lora is None or not (d / "adapter").is_dir():
        raise ValueError(f"{d}: a {'LoRA' if tr.lora is None else 'full fine-tuning'} checkpoint cannot resume "
                         f"a {'full fine-tuning' if tr.lora is None else 'LoRA'} run (--lora-rank differs)")
    if tr.fsdp:   # every rank keeps its shard of the adapters and their optimizer state
        fsdp_lora.load_lora(tr, d)
        return
    tr.lora.load_adapter(d / "adapter")
    tr.optimizer.load_state_dict(load_pt(d / "optimizer.pt", map_location=tr.device))
    tr.scheduler.load_state_dict(load_pt(d / "scheduler.pt"))
    set_rng_state(read_rng_file(d / "rng.pt"))
    tr.version = int(json.loads((d / "trainer_state.json").read_text())["version"])


def _read_legacy_weights(tr, d: Path) -> dict[str, torch.Tensor]:
    """The one-process checkpoint's ``model/*.safetensors``, every parameter of ``tr.model`` present."""
    from safetensors.torch import load_file   # import cost: as in slick.ckpt.dcp

    sd = {}
    shapes = {n: tuple(p.shape) for n, p in tr.model.named_parameters()}
    for f in sorted((d / "model").glob("*.safetensors")):
        check_weights_header(f, shapes)   # before load_file allocates what the header claims
        sd.update(load_file(str(f)))
    if not sd:
        raise FileNotFoundError(f"{d / 'model'}: no .safetensors weights")
    sd = fuse_expert_weights(sd, tr.model)   # an MoE's per-expert tensors as its fused parameters (train/moe.py)
    missing = [n for n, _ in tr.model.named_parameters() if n not in sd]
    if missing:
        raise KeyError(f"{d / 'model'}: checkpoint lacks weights {missing[:5]}")
    return sd


def check_weights_header(f: Path, shapes: dict) -> None:
    """The safetensors header of checkpoint file ``f`` (``slick.models.safetensors_header``: every field against
    the file's size) and the shape of every tensor that is a parameter of the model (``shapes``); ValueError naming
    the file, tensor and field."""
    for name, e in read_header(f).items():
        want = shapes.get(name)
        if want is not None and tuple(e.shape) != tuple(want):
            raise ValueError(f"{f}: tensor {name!r} has shape {list(e.shape)}; the model's is {list(want)} (a "
                             f"checkpoint of another model?)")


def named_weights(tr) -> Iterator[tuple[str, torch.Tensor]]:
    """``Trainer.named_weights``: (HF name, detached tensor) per parameter, tied weights once; LoRA adapters merged
    into the base. Sharded: full (all-gathered) tensors in the compute dtype, collective."""
    if tr.lora is not None:   # the adapters merged into the base (slick.train.lora; sharded: fsdp_lora)
        yield from (fsdp_lora.merged_weights(tr) if tr.fsdp else tr.lora.merged_weights())
        return
    if not tr.fsdp:
        for name, p in tr.model.named_parameters():
            yield name, p.detach()
        return
    cast = torch.bfloat16 if tr.scheme == "bf16" else None
    for name, p in tr.model.named_parameters():
        with D.named_errors(f"named_weights ({name})"):
            t = full_tensor(p.detach())
        yield name, (t.to(cast) if cast is not None else t)


def full_precision_state_dict(tr) -> dict[str, torch.Tensor]:
    """``Trainer.full_precision_state_dict``: HF-named weights at full precision (the fp32 masters in the bf16
    scheme), tied weights once, persistent buffers. Sharded: full tensors on every rank (collective)."""
    if tr.lora is not None:
        return fsdp_lora.merged_state_dict(tr) if tr.fsdp else tr.lora.merged_state_dict()
    sd = {}
    master = dict(zip([id(p) for p in tr.params], tr.master))
    for name, p in tr.model.named_parameters():
        with D.named_errors(f"full_precision_state_dict ({name})") if tr.fsdp else contextlib.nullcontext():
            sd[name] = full_tensor(master.get(id(p), p).detach())
    persistent = set(tr.model.state_dict())
    for name, b in tr.model.named_buffers():
        if name in persistent:
            sd[name] = full_tensor(b.detach())
    return sd

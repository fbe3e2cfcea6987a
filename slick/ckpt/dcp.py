"""Sharded trainer checkpoints with ``torch.distributed.checkpoint`` (DCP), and their HF export.

Layout of a sharded trainer directory (written by every rank of an FSDP trainer, read by any number)::

    dir/
      dcp/                   DCP: .metadata + one __<rank>_0.distcp per rank
                               model.<hf name>          fp32 master weights (sharded DTensors)
                               optim.<hf name>.<key>    AdamW state (exp_avg, exp_avg_sq sharded; step)
      hf/                    config.json, generation_config.json, tokenizer files (no weights)
      scheduler.pt           LR scheduler state (rank 0)
      optim_groups.pt        optimizer param-group hyper-parameters (rank 0)
      rng/rank_00000.pt ...  per-rank RNG states
      trainer_state.json     written LAST by rank 0, after a barrier: the "complete" marker

DCP stores each tensor's global shape and which chunk each rank wrote, so a load reshards: 2 ranks -> 1
(plain full tensors, no process group needed), 1 -> 2, N -> M. RNG: rank r restores ``rank_r`` when the
writer had that rank, else rank 0's state. All ranks must see the same filesystem.
"""
from __future__ import annotations

import contextlib
import copy
import json
import warnings
from pathlib import Path

import torch

from slick.proc import dist as D
from slick.ckpt.atomic_files import write_text_atomic
from slick.ckpt.rng import read_rng_file, save_rng_file, set_rng_state
from slick.ckpt.safe_load import load_pt

MARKER = "trainer_state.json"


def _dcp_load(sd: dict, path: Path, no_dist: bool) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():   # loading in one process is the intent here, not an accident
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(sd, checkpoint_id=str(path), no_dist=no_dist)


def is_sharded(d) -> bool:
    """True when ``d`` holds a sharded (DCP) trainer checkpoint."""
    return (Path(d) / "dcp" / ".metadata").is_file()


def _rng_file(d: Path, rank: int) -> Path:
    return d / "rng" / f"rank_{rank:05d}.pt"


def write_hf_dir(out, config, state_dict: dict, tokenizer, generation_config=None) -> None:
    """Write an HF model directory (fp32 safetensors, config, generation config, tokenizer) from full tensors."""
    from transformers import AutoModelForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = copy.deepcopy(config)
    cfg.dtype = torch.float32
    with torch.device("meta"):   # the module only drives save_pretrained (names, tied weights, metadata)
        shell = AutoModelForCausalLM.from_config(cfg)
    if generation_config is not None:
        shell.generation_config = generation_config
    shell.save_pretrained(out, state_dict=state_dict)
    tokenizer.save_pretrained(out)


def save_sharded(tr, out_dir) -> None:
    """Collective: write ``tr`` (an FSDP Trainer) into ``out_dir`` in the layout above."""
    import torch.distributed.checkpoint as dcp

    out = Path(out_dir)
    if tr.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / MARKER).unlink(missing_ok=True)   # an overwritten directory is incomplete until the end
        (out / "rng").mkdir(exist_ok=True)
    D.barrier(f"save {out}: directory created")
    sd = {f"model.{n}": m.detach() for n, m in zip(tr.param_names, tr.master)}
    has_optim = False
    for n, m in zip(tr.param_names, tr.master):
        for k, v in tr.optimizer.state.get(m, {}).items():
            if torch.is_tensor(v):
                sd[f"optim.{n}.{k}"] = v
                has_optim = True
    with D.named_errors(f"save {out}: torch.distributed.checkpoint.save"):
        dcp.save(sd, checkpoint_id=str(out / "dcp"))
    save_rng_file(_rng_file(out, tr.rank))
    if tr.rank == 0:
        torch.save(tr.scheduler.state_dict(), out / "scheduler.pt")
        torch.save([{k: v for k, v in g.items() if k != "params"} for g in tr.optimizer.param_groups],
                   out / "optim_groups.pt")
        hf = out / "hf"
        hf.mkdir(exist_ok=True)
        cfg = copy.deepcopy(tr.model.config)
        cfg.dtype = torch.float32
        cfg.save_pretrained(hf)
        if getattr(tr.model, "generation_config", None) is not None:
            tr.model.generation_config.save_pretrained(hf)
        tr.tokenizer.save_pretrained(hf)
    D.barrier(f"save {out}: every rank's shard written")
    if tr.rank == 0:
        write_text_atomic(out / MARKER, json.dumps({
            "version": tr.version, "scheme": tr.scheme, "model_path": tr.model_path, "format": "dcp",
            "world_size": tr.world_size, "optim_state": has_optim, "param_names": tr.param_names}))
    D.barrier(f"save {out}: marker written")


def state_positions(optimizer) -> dict[int, int]:
    """{id(parameter): its index in ``optimizer.state_dict()``}: parameters numbered group after group."""
    return {id(p): j for j, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}


def number_groups(groups: list[dict], optimizer, d: Path) -> list[dict]:
    """Saved ``groups`` (hyper-parameters) given the parameter indices of ``optimizer``'s groups, in place; a
    different number of groups (--weight-decay 0 on one side only: slick.train.optim.decay_groups) is an error."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(f"{d}: the checkpoint's optimizer has {len(groups)} parameter group(s), this run's "
                         f"{len(optimizer.param_groups)}: resume with the --weight-decay it was saved with (0 gives "
                         f"one group, above 0 two: matrices and vectors)")
    start = 0
    for g, live in zip(groups, optimizer.param_groups):
        g["params"] = list(range(start, start + len(live["params"])))
        start += len(live["params"])
    return groups


def _read_meta(d: Path) -> dict:
    return json.loads((d / MARKER).read_text())


def _storage_metadata(d: Path) -> dict:
    from torch.distributed.checkpoint import FileSystemReader

    return FileSystemReader(str(d / "dcp")).read_metadata().state_dict_metadata


def load_sharded(tr, in_dir) -> None:
    """Restore ``tr`` (one process or FSDP, collective then) from a sharded checkpoint written by any number
    of ranks."""
    d = Path(in_dir)
    meta = _read_meta(d)
    saved = meta.get("param_names")
    if saved is not None and list(saved) != list(tr.param_names):
        diff = sorted(set(saved) ^ set(tr.param_names))[:5]
        raise KeyError(f"{d}: checkpoint parameters differ from the model's (e.g. {diff}); same architecture?")
    storage = _storage_metadata(d)
    sd = {f"model.{n}": m.detach() for n, m in zip(tr.param_names, tr.master)}
    optim_keys: dict[int, dict[str, str]] = {}
    pos = state_positions(tr.optimizer)
    if meta.get("optim_state"):
        for n, m in zip(tr.param_names, tr.master):
            i = pos[id(m)]
            prefix = f"optim.{n}."
            for key, md in storage.items():
                if not key.startswith(prefix):
                    continue
                k = key[len(prefix):]
                if tuple(md.size) == tuple(m.shape):
                    sd[key] = torch.zeros_like(m, dtype=md.properties.dtype)
                else:
                    sd[key] = torch.zeros(tuple(md.size), dtype=md.properties.dtype, device=tr.device)
                optim_keys.setdefault(i, {})[k] = key
    with D.named_errors(f"load {d}: torch.distributed.checkpoint.load") if tr.fsdp else contextlib.nullcontext():
        _dcp_load(sd, d / "dcp", no_dist=not tr.fsdp)
    with torch.no_grad():
        if not tr.fsdp:
            for p, m in zip(tr.params, tr.master):
                if p is not m:   # one-process bf16 scheme: bf16 weights from the fp32 masters
                    p.copy_(m)
    groups = number_groups(load_pt(d / "optim_groups.pt"), tr.optimizer, d)
    state = {i: {k: sd[key] for k, key in ks.items()} for i, ks in optim_keys.items()}
    tr.optimizer.load_state_dict({"state": state, "param_groups": groups})
    tr.scheduler.load_state_dict(load_pt(d / "scheduler.pt"))
    rng = _rng_file(d, tr.rank)
    set_rng_state(read_rng_file(rng if rng.is_file() else _rng_file(d, 0)))
    tr.version = int(meta["version"])
    D.barrier(f"load {d}: done")


def load_legacy_sharded(tr, d: Path, full_sd: dict) -> None:
    """Collective: restore an FSDP trainer from a one-process checkpoint (full HF weights + optimizer.pt);
    every rank reads the files and keeps its own shard (no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    def local_shard(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        full = full.to(device=tr.device, dtype=like.dtype)
        if isinstance(like, DTensor) and tuple(full.shape) == tuple(like.shape):
            return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
        return full

    with torch.no_grad():
        for n, m in zip(tr.param_names, tr.master):
            m.copy_(local_shard(full_sd[n], m))
    opt = load_pt(d / "optimizer.pt", map_location="cpu")
    number_groups(opt["param_groups"], tr.optimizer, d)   # the same groups: the same state numbering
    state, pos = {}, state_positions(tr.optimizer)
    for m in tr.master:
        i = pos[id(m)]
        st = opt["state"].get(i)
        if st:
            state[i] = {k: local_shard(v, m) if torch.is_tensor(v) and v.dim() else v for k, v in st.items()}
    tr.optimizer.load_state_dict({"state": state, "param_groups": opt["param_groups"]})
    tr.scheduler.load_state_dict(load_pt(d / "scheduler.pt"))
    set_rng_state(read_rng_file(d / "rng.pt"))
    tr.version = int(_read_meta(d)["version"])
    D.barrier(f"load {d}: done")


def export_sharded(d, out_dir) -> None:
    """Write the HF directory of sharded checkpoint ``d`` into ``out_dir`` (one process, no trainer)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    d = Path(d)
    hf = d / "hf"
    if not (hf / "config.json").is_file():
        raise FileNotFoundError(f"{hf}: sharded checkpoint has no config.json")
    sd = {k: torch.empty(tuple(md.size), dtype=md.properties.dtype)
          for k, md in _storage_metadata(d).items() if k.startswith("model.")}
    if not sd:
        raise FileNotFoundError(f"{d / 'dcp'}: no model weights in the sharded checkpoint")
    _dcp_load(sd, d / "dcp", no_dist=True)
    weights = {k[len("model."):]: v for k, v in sd.items()}
    gen = GenerationConfig.from_pretrained(hf) if (hf / "generation_config.json").is_file() else None
    write_hf_dir(out_dir, AutoConfig.from_pretrained(hf), weights, AutoTokenizer.from_pretrained(hf), gen)


"""Adapter-only weight updates: a PEFT LoRA adapter merged into the engine's weights on arrival.

A LoRA run's trainer changes only its adapters, so a sync can carry the adapter alone (``lora_A``: ``[r, in]`` and
``lora_B``: ``[out, r]`` per adapted linear layer, 1-9% of the model at rank 8-64) instead of the merged weights.
The engine rebuilds each adapted weight as ``W = W_base + scaling * B @ A`` (in fp32, then cast to its dtype) and
copies the result in through its ordinary all-or-nothing update; ``scaling`` is ``lora_alpha / r``
(``lora_alpha / sqrt(r)`` with rsLoRA).

``W_base`` is read from the engine's own model directory (the ``--hf-checkpoint`` it was started with, memory-mapped;
nothing is kept in memory between syncs): the engine serves that base plus the adapter, as vLLM's LoRA does. Each
adapter replaces the previous one (the base is re-read every time, so no rounding accumulates). A trainer whose
base differs from the engine's is caught by the weight check after the sync (``slick.weights.check``).

An adapter arrives as a :class:`LoraDelta` (in-process engines) or as a PEFT adapter directory
(``adapter_config.json`` + ``adapter_model.safetensors``: :func:`read_adapter_dir`). Checked before any weight
changes (``slick.models.adapter_check``, the rules ``--lora-load`` follows too): PEFT options the merge does not
implement (DoRA, per-layer rank or alpha patterns, ``fan_in_fan_out``) are refused, rank and alpha must be in range
(alpha finite), every adapted layer must be a weight of the model with shapes ``A: [r, in]``, ``B: [out, r]``, and
every adapter value and every merged weight must be finite.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from slick.engine.model import safetensor_files
from slick.engine.weight_check import WeightUpdateError
from slick.models.adapter_check import config_problems, weights_problems

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraDelta:
    """One adapter: ``scaling`` and, per adapted weight (HF name, e.g. ``model.layers.0.self_attn.q_proj.weight``),
    its ``(A, B)`` pair."""

    scaling: float
    pairs: dict

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for a, b in self.pairs.values() for t in (a, b))


def is_adapter_dir(path) -> bool:
    """Whether ``path`` is a PEFT adapter directory (it has ``adapter_config.json``)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def scaling_of(config: dict, where: str) -> float:
    """``lora_alpha / r`` (rsLoRA: ``/ sqrt(r)``); WeightUpdateError naming the field for what the merge does not do
    or a rank or alpha out of range (``slick.models.adapter_check``: the rules ``--lora-load`` follows too)."""
    problems = config_problems(config, where)
    if problems:
        raise WeightUpdateError("; ".join(problems))
    r = config["r"]
    alpha = float(config.get("lora_alpha") or r)
    return alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r


def parse_peft(config: dict, tensors: dict, where: str = "adapter") -> LoraDelta:
    """A :class:`LoraDelta` from PEFT's adapter config and state dict (``base_model.model.<module>.lora_A.weight``
    names, as ``get_peft_model_state_dict`` and ``adapter_model.safetensors`` have them)."""
    scaling = scaling_of(config, where)
    halves: dict = {}
    for name, t in tensors.items():
        stem = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
        for part in ("lora_A", "lora_B"):
            suffix = f".{part}.weight"
            if stem.endswith(suffix):
                halves.setdefault(stem[:-len(suffix)] + ".weight", {})[part] = t
                break
        else:
            raise WeightUpdateError(f"{where}: tensor {name!r} is not a LoRA A/B weight (biases, embeddings and "
                                    f"other PEFT modules are not merged)")
    pairs = {}
    for weight, h in halves.items():
        if set(h) != {"lora_A", "lora_B"}:
            raise WeightUpdateError(f"{where}: {weight!r} has {sorted(h)} but not both lora_A and lora_B")
        pairs[weight] = (h["lora_A"], h["lora_B"])
    if not pairs:
        raise WeightUpdateError(f"{where}: the adapter holds no LoRA weights")
    return LoraDelta(scaling, pairs)


def read_adapter_dir(path) -> LoraDelta:
    """The adapter of a PEFT directory; WeightUpdateError naming the file when it cannot be used."""
    from safetensors.torch import load_file

    d = Path(path)
    try:
        config = json.loads((d / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise WeightUpdateError(f"{d / ADAPTER_CONFIG}: not a readable adapter config ({e})") from None
    scaling_of(config, str(d / ADAPTER_CONFIG))
    problems = weights_problems(d, config["r"])   # names, dtypes, shapes from the header: before reading data
    if problems:
        raise WeightUpdateError("; ".join(problems))
    try:
        tensors = load_file(str(d / ADAPTER_WEIGHTS))
    except Exception as e:  # noqa: BLE001 - SafetensorError, OSError: the file cannot be used
        raise WeightUpdateError(f"{d / ADAPTER_WEIGHTS}: not a readable safetensors file "
                                f"({type(e).__name__}: {e})") from None
    return parse_peft(config, tensors, str(d))


def check_delta(shapes: dict, delta: LoraDelta, where: str = "adapter") -> None:
    """Every adapted weight is one of the model's (``shapes``: HF name -> shape) and ``A``/``B`` fit it."""
    for name, (a, b) in delta.pairs.items():
        want = shapes.get(name)
        if want is None:
            raise WeightUpdateError(f"{where}: adapted layer {name!r} is not a weight of this model")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != tuple(want):
            raise WeightUpdateError(f"{where}: {name!r}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not "
                                    f"make the model's {list(want)}")
        if not (a.is_floating_point() and b.is_floating_point()):
            raise WeightUpdateError(f"{where}: {name!r}: adapter weights must be floating point")
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
            raise WeightUpdateError(f"{where}: {name!r}: adapter weights hold NaN or infinite values")


def base_tensors(model_dir, names: set) -> dict:
    """``names`` read (memory-mapped) from the safetensors of ``model_dir``; WeightUpdateError for a missing one."""
    from safetensors import safe_open

    out = {}
    for f in safetensor_files(model_dir):
        with safe_open(str(f), framework="pt") as h:
            for name in set(h.keys()) & (names - set(out)):
                out[name] = h.get_tensor(name)
    missing = sorted(names - set(out))
    if missing:
        raise WeightUpdateError(f"{model_dir}: the base model lacks {missing[0]!r} (and {len(missing) - 1} more), "
                                f"needed to merge the adapter")
    return out


def merged_weights(shapes: dict, delta: LoraDelta, model_dir, extra: set = frozenset()
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Check ``delta`` (all of it, before anything is yielded), then yield ``(name, W_base + scaling * B @ A)`` in
    fp32 for every adapted weight, and the base of the ``extra`` names (weights an update must write anyway)."""
    check_delta(shapes, delta)
    base = base_tensors(model_dir, set(delta.pairs) | set(extra))

    def gen():
        for name, (a, b) in delta.pairs.items():
            # out of place: the base tensors are views of the memory-mapped file (writing them in place would
            # copy every page on write: about 10x slower)
            w = torch.addmm(base.pop(name).float(), b.float(), a.float(), alpha=delta.scaling)
            if not bool(torch.isfinite(w).all()):   # the update's check takes every pair before copying any
                raise WeightUpdateError(f"adapter: {name!r} merged with scaling {delta.scaling:g} is not finite")
            yield name, w
        yield from base.items()
    return gen()

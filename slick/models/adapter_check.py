"""Check a LoRA rank and alpha, and a PEFT LoRA adapter directory, before anything loads it (standard library only).

One set of rules for every path an adapter takes into slick: ``--lora-rank`` / ``--lora-alpha`` at start-up,
``--lora-load`` at start-up and when the trainer builds its adapters, and an adapter directory given to an
engine's weight update (``/update_weights_from_disk`` of ``slick serve``, ``LocalEngine.update_weights``):

* rank an integer in [1, :data:`MAX_RANK`]; alpha a finite number in (0, :data:`MAX_ALPHA`] (NaN, inf or 1e308
  would make every adapted weight non-finite);
* ``adapter_config.json``: a JSON object with ``peft_type`` LORA and no PEFT option slick does not merge the same
  way on both sides (DoRA, ``fan_in_fan_out``, per-layer ``rank_pattern`` / ``alpha_pattern``);
* ``adapter_model.safetensors``: a header that checks out (``slick.models.safetensors_header``), only ``lora_A`` /
  ``lora_B`` floating-point weights, both halves of every layer, ``A: [r, in]`` and ``B: [out, r]`` with the
  config's ``r``, and, given the model's weight shapes, ``[out, in]`` of a weight of the model.

Each problem is one message naming the file and the field (or tensor). Tensor values are checked where they are
read (``slick.engine.lora_merge``, ``slick.train.lora``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from slick.models.safetensors_header import SafetensorsHeaderError, read_header

MAX_RANK = 1 << 16
MAX_ALPHA = 65536.0
ADAPTER = "default"            # PEFT's adapter name; a policy has one
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
UNMERGED = {"use_dora": "DoRA adapters", "fan_in_fan_out": "fan_in_fan_out adapters",
            "rank_pattern": "per-layer rank_pattern", "alpha_pattern": "per-layer alpha_pattern"}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def rank_problem(rank, where: str = "--lora-rank") -> Optional[str]:
    """Why ``rank`` is not a usable LoRA rank (None when it is)."""
    if not _is_int(rank) or not 1 <= rank <= MAX_RANK:
        return f"{where} must be an integer in [1, {MAX_RANK}], got {rank!r}"
    return None


def alpha_problem(alpha, where: str = "--lora-alpha") -> Optional[str]:
    """Why ``alpha`` is not a usable LoRA alpha (None when it is): finite, in (0, MAX_ALPHA]."""
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha) \
            or not 0 < alpha <= MAX_ALPHA:
        return f"{where} must be a finite number in (0, {MAX_ALPHA:g}], got {alpha!r}"
    return None


def config_problems(conf, where: str) -> list[str]:
    """Problems of an ``adapter_config.json`` dict (``where``: the file, for the messages)."""
    if not isinstance(conf, dict):
        return [f"{where}: holds {type(conf).__name__}, not a JSON object"]
    if conf.get("peft_type") != "LORA":
        return [f"{where}: field 'peft_type' is {conf.get('peft_type')!r}: not a LoRA adapter"]
    p = [m for m in (rank_problem(conf.get("r"), f"{where}: field 'r'"),) if m]
    if "lora_alpha" in conf:
        p += [m for m in (alpha_problem(conf["lora_alpha"], f"{where}: field 'lora_alpha'"),) if m]
    p += [f"{where}: field {k!r}: {what} are not supported (the engines merge W + B @ A * alpha / r)"
          for k, what in UNMERGED.items() if conf.get(k)]
    return p


def read_config(path) -> dict:
    """``adapter_config.json`` of the adapter directory ``path`` as a dict (unchecked); ValueError naming it."""
    f = Path(path) / ADAPTER_CONFIG
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not a PEFT adapter directory ({ADAPTER_CONFIG} missing)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{f}: not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None


def weight_name(tensor: str) -> tuple[Optional[str], Optional[str]]:
    """``(HF weight name, "lora_A" | "lora_B")`` of a PEFT tensor name, ``(None, None)`` for anything else."""
    stem = tensor[len(PEFT_PREFIX):] if tensor.startswith(PEFT_PREFIX) else tensor
    for part in ("lora_A", "lora_B"):
        if stem.endswith(f".{part}.weight"):
            return stem[:-len(f".{part}.weight")] + ".weight", part
    return None, None


def _pair_problem(f, weight: str, a, b, r: int, shapes: Optional[dict]) -> Optional[str]:
    if a is None or b is None:
        return f"{f}: {weight!r} has {'lora_B' if a is None else 'lora_A'} but not {'lora_A' if a is None else 'lora_B'}"
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[0] != r or b.shape[1] != r:
        return (f"{f}: {weight!r}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not [r, in] and [out, r] "
                f"with the config's r = {r}")
    if shapes is not None:
        want = shapes.get(weight)
        if want is None:
            return f"{f}: adapted layer {weight!r} is not a weight of the model"
        if (b.shape[0], a.shape[1]) != tuple(want):
            return f"{f}: {weight!r}: lora_B @ lora_A is [{b.shape[0]}, {a.shape[1]}]; the model's weight is {list(want)}"
    return None


def weights_problems(path, r: int, shapes: Optional[dict] = None) -> list[str]:
    """Problems of ``adapter_model.safetensors`` in ``path`` (header only; module doc). ``shapes``: HF weight
    name -> shape of the model the adapter is for (None: not checked against a model)."""
    f = Path(path) / ADAPTER_WEIGHTS
    if not f.is_file():
        return [f"{f}: missing (a PEFT adapter directory holds its weights there)"]
    try:
        header = read_header(f)
    except SafetensorsHeaderError as e:
        return [str(e)]
    halves: dict = {}
    for name, e in header.items():
        weight, part = weight_name(name)
        if weight is None:
            return [f"{f}: tensor {name!r} is not a LoRA A/B weight (biases, embeddings and other PEFT modules are "
                    f"not supported)"]
        if e.dtype not in FLOAT_DTYPES:
            return [f"{f}: tensor {name!r} has dtype {e.dtype}; adapter weights must be floating point"]
        halves.setdefault(weight, {})[part] = e
    if not halves:
        return [f"{f}: holds no LoRA weights"]
    for weight, h in halves.items():
        problem = _pair_problem(f, weight, h.get("lora_A"), h.get("lora_B"), r, shapes)
        if problem:
            return [problem]
    return []


def adapter_problems(path, shapes: Optional[dict] = None) -> list[str]:
    """Every problem of the PEFT LoRA adapter directory ``path`` (module doc), one message each; empty: usable."""
    try:
        conf = read_config(path)
    except (FileNotFoundError, ValueError) as e:
        return [str(e)]
    p = config_problems(conf, str(Path(path) / ADAPTER_CONFIG))
    return p or weights_problems(path, conf["r"], shapes)

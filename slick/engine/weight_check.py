"""All-or-nothing weight updates: check a whole update before any live weight changes.

An update of :class:`slick.engine.local.LocalEngine` either applies completely or changes nothing. Before
the engine copies a single tensor, every safetensors file of the directory must open (only headers are
read, no tensor data), every name must be a weight of the model, every shape must match and every dtype
must be floating point. safetensors checks at open that a file's header covers the file exactly, so a
truncated or corrupt shard fails here rather than half-way through the copy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from slick.engine.model import SKIPPED_SUFFIX, safetensor_files

FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}   # safetensors dtype names


class WeightUpdateError(ValueError):
    """A weight update was refused; the engine's weights and weight version are unchanged."""


def check_dir(shapes: dict[str, tuple], path: str | Path, required: set = frozenset()) -> list[Path]:
    """Check every ``*.safetensors`` file of ``path`` against ``shapes`` (HF name -> the model's shape), and
    that the names in ``required`` are all there; return the files. Raises :class:`WeightUpdateError` naming
    the file and tensor, or FileNotFoundError."""
    from safetensors import safe_open

    files = safetensor_files(path)
    found, names = 0, set()
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                header = [(name, h.get_slice(name)) for name in h.keys()]
                header = [(name, tuple(s.get_shape()), s.get_dtype()) for name, s in header]
        except Exception as e:  # noqa: BLE001 - SafetensorError, OSError, ...: all mean "cannot use this file"
            raise WeightUpdateError(f"{f}: not a readable safetensors file ({type(e).__name__}: {e})") from None
        for name, shape, dtype in header:
            if name.endswith(SKIPPED_SUFFIX):
                continue
            _check_one(shapes, name, shape, dtype in FLOAT_DTYPES, dtype, str(f))
            found += 1
            names.add(name)
    if not found:
        raise WeightUpdateError(f"{path}: no weights of this model found in its safetensors files")
    _check_complete(required, names, str(path))
    return files


def check_named(shapes: dict[str, tuple], named: Iterable,
                required: set = frozenset()) -> list[tuple[str, torch.Tensor]]:
    """Materialise ``(hf_name, tensor)`` pairs and check each against ``shapes`` (and that the names in
    ``required`` are all there); return the pairs."""
    pairs = list(named)
    for name, t in pairs:
        if name.endswith(SKIPPED_SUFFIX):
            continue
        _check_one(shapes, name, tuple(t.shape), t.is_floating_point(), str(t.dtype), "named_tensors")
    _check_complete(required, {name for name, _ in pairs}, "named_tensors")
    return pairs


def _check_complete(required: set, names: set, where: str) -> None:
    lacking = sorted(set(required) - names)
    if lacking:
        raise WeightUpdateError(f"{where}: lacks {len(lacking)} weight(s) the engine released (release_memory), "
                                f"e.g. {lacking[0]!r}: the first update after a release must send them all")


def _check_one(shapes: dict, name: str, shape: tuple, is_float: bool, dtype: str, where: str) -> None:
    want = shapes.get(name)
    if want is None:
        raise WeightUpdateError(f"{where}: tensor {name!r} is not a weight of this model")
    if tuple(want) != shape:
        raise WeightUpdateError(f"{where}: tensor {name!r} has shape {list(shape)}; the model's is "
                                f"{list(want)}")
    if not is_float:
        raise WeightUpdateError(f"{where}: tensor {name!r} has dtype {dtype}; weights must be floating point")

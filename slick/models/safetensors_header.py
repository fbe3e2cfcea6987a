"""Read and check a ``.safetensors`` file's header before anything allocates for it (standard library only).

A safetensors file is an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__"?: {...}}`` and the tensor bytes. A hostile or damaged file can claim
any shape (a 1e7 x 1e7 tensor in a 1 KiB file), any offsets, or a header of gigabytes. :func:`read_header` checks
every field against the file's real size (header at most 100 MiB, as the safetensors library's own limit; every
shape a list of non-negative integers whose bytes equal its offsets' span; every span inside the file) and raises
:class:`SafetensorsHeaderError` naming the file, the tensor and the field, so callers refuse it before loading.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_HEADER_BYTES = 100 * 2**20
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "C64": 8}


class SafetensorsHeaderError(ValueError):
    """A safetensors file whose header cannot describe its contents; nothing of it was loaded."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header describes it."""

    dtype: str
    shape: tuple
    begin: int
    end: int


def _entry(f: Path, name: str, v, data_len: int) -> TensorEntry:
    where = f"{f}: tensor {name!r}"
    if not isinstance(v, dict):
        raise SafetensorsHeaderError(f"{where}: header entry is {type(v).__name__}, not an object")
    dtype, shape, offsets = v.get("dtype"), v.get("shape"), v.get("data_offsets")
    if not isinstance(dtype, str):
        raise SafetensorsHeaderError(f"{where}: field 'dtype' is {dtype!r}, not a dtype name")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise SafetensorsHeaderError(f"{where}: field 'shape' is {str(shape)[:80]}, not a list of non-negative "
                                     f"integers")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise SafetensorsHeaderError(f"{where}: field 'data_offsets' is {str(offsets)[:80]}, not [begin, end] "
                                     f"with 0 <= begin <= end")
    if offsets[1] > data_len:
        raise SafetensorsHeaderError(f"{where}: field 'data_offsets' {offsets} reaches past the file's "
                                     f"{data_len} data bytes")
    size = DTYPE_BYTES.get(dtype)
    if size is not None and math.prod(shape) * size != offsets[1] - offsets[0]:
        raise SafetensorsHeaderError(f"{where}: field 'shape' {shape} of {dtype} needs {math.prod(shape) * size} "
                                     f"bytes; its data_offsets hold {offsets[1] - offsets[0]}")
    return TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])


def read_header(path) -> dict[str, TensorEntry]:
    """``{name: TensorEntry}`` of the safetensors file ``path`` (``__metadata__`` left out), every field checked
    against the file (module doc); :class:`SafetensorsHeaderError` naming file, tensor and field otherwise."""
    f = Path(path)
    try:
        total = f.stat().st_size
        with open(f, "rb") as h:
            head = h.read(8)
            if len(head) < 8:
                raise SafetensorsHeaderError(f"{f}: {total} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or n > total - 8:
                raise SafetensorsHeaderError(f"{f}: header length {n} bytes exceeds "
                                             f"{'the file' if n <= MAX_HEADER_BYTES else 'the 100 MiB limit'}")
            raw = h.read(n)
    except OSError as e:
        raise SafetensorsHeaderError(f"{f}: cannot read ({e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SafetensorsHeaderError(f"{f}: header is not valid JSON ({type(e).__name__}: {str(e)[:120]})") \
            from None
    if not isinstance(header, dict):
        raise SafetensorsHeaderError(f"{f}: header is {type(header).__name__}, not an object")
    data_len = total - 8 - n
    return {name: _entry(f, name, v, data_len) for name, v in header.items() if name != "__metadata__"}

"""Optional native CPU kernels for the decode step, compiled on first use and loaded with ctypes.

A decode step at a few dozen rows is bound by reading the weights (the matmuls, see
:mod:`slick.engine.linear`) and, after that, by the many small kernels between the matmuls. ``csrc/decode.c``
replaces those with two: an RMSNorm, and RoPE + KV-cache write + attention for all sequences and heads in one
OpenMP loop (torch's flash-attention kernel spends ~250 us per layer on 96 tiny (sequence, head) problems;
this loop takes a fraction of that). Both work on fp32 and bf16 storage with fp32 arithmetic.

The library is built and cached by :mod:`slick.native_build` (the system C++ compiler, ``$CXX`` or ``c++``,
into ``$SLICK_CACHE/native``). Where there is no compiler, the build fails, or ``SLICK_NATIVE=0``, :func:`load`
returns ``None`` and the engine keeps its pure-torch path (same results within rounding). The build takes about
a second.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Optional

import torch

from slick.native_build import build_library, cache_dir, enabled, load_library  # noqa: F401 - cache_dir: re-exported

SOURCE = Path(__file__).with_name("csrc") / "decode.cpp"
_lock = threading.Lock()
_cached: dict[int, "NativeKernels"] = {}


def build(cc: str, march: str = "native") -> Path:
    """Compile ``csrc/decode.cpp`` for ``-march=<march>`` (unless cached) and return the library's path."""
    return build_library(SOURCE, "slick_decode", cc, march)


def load() -> Optional["NativeKernels"]:
    """The kernels, built if needed; ``None`` where they are unavailable (see the module doc)."""
    if not enabled():
        return None
    lib = load_library(SOURCE, "slick_decode", "LocalEngine uses its pure-torch decode path")
    with _lock:    # one binding per library (each compiler builds its own)
        if lib is not None and id(lib) not in _cached:
            _cached[id(lib)] = NativeKernels(lib)
        return _cached[id(lib)] if lib is not None else None


_I64, _F32, _P = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


class NativeKernels:
    """ctypes bindings for ``csrc/decode.c``. Tensors must be on CPU, contiguous where documented."""

    dtypes = tuple(_SUFFIX)

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        # the ctypes functions by dtype; raw_norm/raw_attn also serve callers that pass raw pointers
        # (Transformer._decode_native)
        self.raw_norm, self.raw_attn, self._sample = {}, {}, {}
        for dt, sfx in _SUFFIX.items():
            f = getattr(lib, f"rmsnorm_{sfx}")
            f.argtypes, f.restype = [_P, _P, _P, _I64, _I64, _I64, _F32, ctypes.c_int], None
            self.raw_norm[dt] = f
            f = getattr(lib, f"decode_attn_{sfx}")
            f.argtypes = [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _P, _I64, _P, _F32, ctypes.c_int]
            f.restype = ctypes.c_int
            self.raw_attn[dt] = f
            f = getattr(lib, f"sample_{sfx}")
            f.argtypes, f.restype = [_P, _I64, _I64, _P, _P, _P, _P, ctypes.c_int], None
            self._sample[dt] = f

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dim (HF order: normalise in fp32, cast to the storage dtype, scale by w)."""
        H = x.shape[-1]
        if x.stride(-1) != 1 or not w.is_contiguous():
            x, w = x.contiguous(), w.contiguous()
        x2 = x.reshape(-1, H) if x.dim() != 2 else x
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = torch.empty(x2.shape, dtype=x.dtype)
        self.raw_norm[x.dtype](x2.data_ptr(), w.data_ptr(), out.data_ptr(), x2.shape[0], H, x2.stride(0), eps,
                             torch.get_num_threads())
        return out.view(x.shape)

    def decode_attention(self, qkv: torch.Tensor, nh: int, nkv: int, cos: torch.Tensor, sin_signed: torch.Tensor,
                         pos: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
        """RoPE, KV write at ``pos`` and attention over positions ``0..pos`` for slots ``0..B-1``.

        ``qkv`` [B, nh+2*nkv, hd] (rows contiguous); ``cos``/``sin_signed`` [n, hd] contiguous tables;
        ``pos`` int64 [B]; ``kc``/``vc`` [slots, nkv, cap, hd] contiguous. Returns [B, nh*hd].
        """
        B, _, hd = qkv.shape
        out = torch.empty(B, nh * hd, dtype=qkv.dtype)
        rc = self.raw_attn[qkv.dtype](qkv.data_ptr(), qkv.stride(0), B, nh, nkv, hd, cos.data_ptr(), sin_signed.data_ptr(),
                              pos.data_ptr(), kc.data_ptr(), vc.data_ptr(), kc.shape[2], out.data_ptr(),
                              hd ** -0.5, torch.get_num_threads())
        if rc:
            raise ValueError(f"native decode attention does not support nh={nh} nkv={nkv} head_dim={hd}")
        return out

    def supports_attention(self, nh: int, nkv: int, hd: int) -> bool:
        """Whether :meth:`decode_attention` handles this head layout (head_dim 16/32/64/128/256, nh/nkv <= 16)."""
        return bool(self.lib.slick_attn_supported(ctypes.c_int64(nh), ctypes.c_int64(nkv), ctypes.c_int64(hd)))

    def sample(self, logits: torch.Tensor, inv_temp: torch.Tensor, u: torch.Tensor) -> tuple[list[int], list[float]]:
        """Untruncated sampling of each row of ``logits`` [B,V] (fp32 or bf16): ``inv_temp`` fp32 [B] (0 = greedy),
        ``u`` fp32 [B] uniforms. Picks the first token whose cumulative probability exceeds ``u`` (greedy: the
        first maximum); returns (tokens, log_softmax(logits * inv_temp) of each token)."""
        logits = logits.contiguous()
        B, V = logits.shape
        tok = torch.empty(B, dtype=torch.int64)
        lp = torch.empty(B, dtype=torch.float32)
        self._sample[logits.dtype](logits.data_ptr(), B, V, inv_temp.data_ptr(), u.data_ptr(), tok.data_ptr(),
                                   lp.data_ptr(), torch.get_num_threads())
        return tok.tolist(), lp.tolist()

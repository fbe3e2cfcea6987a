"""AdamW with bf16 moments in one native pass over memory (``csrc/adamw.cpp``), for
:class:`slick.train.optim.LowPrecisionAdamW` on CPU.

The torch path of that optimizer widens each slice's moments to fp32, runs torch's fused AdamW, and rounds them
back with a few more elementwise kernels: about 90 bytes of memory traffic per parameter. The native kernel reads
the fp32 weight and gradient and the bf16 moments once and writes them once (20 bytes per parameter): a
SmolLM2-135M step takes 0.085 s in the kernel, the whole ``step()`` 0.10 s, on a 2-core AMX Xeon (the loop must
vectorize: it is built with ``-fno-math-errno``). It applies the same update in fp32 and the same stochastic
rounding, with the same dither values (each slice's offsets are drawn by the caller, in the torch path's order),
so the two paths agree to fp32 rounding (``tests/test_train_optim.py``). Built by :mod:`slick.native_build`;
:func:`load` returns None where it cannot be (the torch path runs then).
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from slick.native_build import load_library

SOURCE = Path(__file__).with_name("csrc") / "adamw.cpp"
_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class NativeAdamW:
    """ctypes binding of ``adamw_bf16_moments``."""

    def __init__(self, lib: ctypes.CDLL):
        f = lib.adamw_bf16_moments
        f.argtypes = [_P, _P, _P, _P, _I64, _I64, _P, _P, _P, _F32, _F32, _F32, _F32, _F32, _F32, _F32, ctypes.c_int]
        f.restype = None
        self._fn = f

    def step(self, w: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, slice_len: int,
             dither: torch.Tensor, m_off: torch.Tensor, v_off: torch.Tensor, *, lr: float, beta1: float,
             beta2: float, eps: float, weight_decay: float, step: int) -> None:
        """One AdamW update in place: ``w``, ``g`` fp32 and ``m``, ``v`` bf16, all contiguous 1-D CPU tensors of
        one length; slice ``s`` (of ``slice_len`` elements) rounds ``m`` with ``dither[m_off[s]:]`` and ``v``
        with ``dither[v_off[s]:]`` (int32 dither, int64 offsets, one per slice)."""
        n = w.numel()
        slices = -(-n // slice_len)
        if not (w.dtype == g.dtype == torch.float32 and m.dtype == v.dtype == torch.bfloat16):
            raise ValueError("NativeAdamW.step: weight and gradient must be fp32 and the moments bf16")
        if not all(t.numel() == n and t.is_contiguous() and t.device.type == "cpu" for t in (g, m, v)) or \
                not w.is_contiguous() or m_off.numel() < slices or v_off.numel() < slices:
            raise ValueError("NativeAdamW.step: tensors must be contiguous CPU tensors of one length, with an "
                             "offset per slice")
        if dither.dtype != torch.int32 or m_off.dtype != torch.int64 or v_off.dtype != torch.int64:
            raise ValueError("NativeAdamW.step: dither must be int32 and the offsets int64")
        if int(max(m_off[:slices].max(), v_off[:slices].max())) + min(slice_len, n) > dither.numel():
            raise ValueError("NativeAdamW.step: an offset reads past the dither table")
        self._fn(w.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), n, slice_len, dither.data_ptr(),
                 m_off.data_ptr(), v_off.data_ptr(), lr, beta1, beta2, eps, weight_decay, 1.0 - beta1 ** step,
                 (1.0 - beta2 ** step) ** 0.5, torch.get_num_threads())


def load() -> Optional[NativeAdamW]:
    """The kernel, built if needed, or None (no compiler, a failed build, ``SLICK_NATIVE=0``)."""
    # no errno from sqrt (of a moment, never negative): the update loop vectorizes
    lib = load_library(SOURCE, "slick_adamw", "AdamW with bf16 moments runs its torch path",
                       flags=("-fno-math-errno",))
    return NativeAdamW(lib) if lib is not None else None

"""RMSNorm forward and backward of the trainer's fused decoder layers in one native pass each (``csrc/rmsnorm.cpp``).

:func:`slick.train.fused_layers.rms_norm` and :func:`~slick.train.fused_layers.rms_norm_backward` in torch run
five to eight elementwise kernels over the ``[tokens, hidden]`` fp32 residual per call, and a training step calls
them six times per decoder layer (two norms, each recomputed in backward, and their two backwards). For an fp32
residual, fp32 norm weights and bf16 matmuls (slick's CPU default) these kernels read the inputs once and write the
results once, with the same maths in fp32: the normed rows in bf16 (rounded to nearest even, as ``.to(bfloat16)``)
and the fp32 gradients. They agree with the torch functions to fp32 rounding (the sums run in another order;
``tests/test_train_native_norm.py``). Built by :mod:`slick.native_build`; without a compiler, with
``SLICK_NATIVE=0`` or for other dtypes and shapes the torch functions run.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Optional

import torch

from slick.native_build import load_library

SOURCE = Path(__file__).with_name("csrc") / "rmsnorm.cpp"
_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_lock = threading.Lock()
_bound: dict[int, "NativeNorm"] = {}    # by id() of the loaded library


class NativeNorm:
    """ctypes binding of ``rmsnorm_fwd`` / ``rmsnorm_bwd``."""

    def __init__(self, lib: ctypes.CDLL):
        self._fwd, self._bwd = lib.rmsnorm_fwd, lib.rmsnorm_bwd
        self._fwd.argtypes = [_P, _P, _P, _P, _I64, _I64, _F32, ctypes.c_int]
        self._bwd.argtypes = [_P, _P, _P, _P, _P, _P, _I64, _I64, ctypes.c_int]
        self._fwd.restype = self._bwd.restype = None

    @staticmethod
    def applies(x: torch.Tensor, w: torch.Tensor, dt: torch.dtype) -> bool:
        """True for what the kernels cover: a contiguous fp32 CPU ``x [N, H]``, fp32 ``w [H]``, bf16 matmuls."""
        return (dt == torch.bfloat16 and x.dtype == w.dtype == torch.float32 and x.device.type == "cpu"
                and x.dim() == 2 and x.is_contiguous() and w.is_contiguous() and w.shape == (x.shape[1],))

    def forward(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(bf16(w * x * r), r [N, 1] fp32)`` with ``r = rsqrt(mean(x^2) + eps)``."""
        N, H = x.shape
        out = torch.empty(N, H, dtype=torch.bfloat16)
        r = torch.empty(N, 1, dtype=torch.float32)
        self._fwd(x.data_ptr(), w.data_ptr(), out.data_ptr(), r.data_ptr(), N, H, eps, torch.get_num_threads())
        return out, r

    def backward(self, x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, dy: torch.Tensor):
        """``(dx [N, H], dw [H])`` in fp32 for the bf16 output gradient ``dy``."""
        N, H = x.shape
        dy = dy.to(torch.bfloat16).contiguous()
        r = r.to(torch.float32).contiguous()
        dx = torch.empty(N, H, dtype=torch.float32)
        dw = torch.empty(H, dtype=torch.float32)
        self._bwd(x.data_ptr(), w.data_ptr(), r.data_ptr(), dy.data_ptr(), dx.data_ptr(), dw.data_ptr(), N, H,
                  torch.get_num_threads())
        return dx, dw


def get() -> Optional[NativeNorm]:
    """The kernels, built on first use, or None (no compiler, a failed build, ``SLICK_NATIVE=0``)."""
    lib = load_library(SOURCE, "slick_rmsnorm", "RMSNorm runs its torch path", flags=("-fno-math-errno",))
    if lib is None:
        return None
    with _lock:
        return _bound.setdefault(id(lib), NativeNorm(lib))

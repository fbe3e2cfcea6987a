"""The trainer's elementwise work around its bf16 matmuls in one native pass each (``csrc/fused.cpp``): RMSNorm,
RoPE and the MLP's SwiGLU product, forward and backward, and the logprobs, entropy and logit gradient of a chunk
of the lm head's output.

RMSNorm. :func:`slick.train.fused_layers.rms_norm` and :func:`~slick.train.fused_layers.rms_norm_backward` in
torch run five to eight elementwise kernels over the ``[tokens, hidden]`` fp32 residual per call, and a training
step calls them six times per decoder layer (two norms, each recomputed in backward, and their two backwards).
For an fp32 residual, fp32 norm weights and bf16 matmuls (slick's CPU default) these kernels read the inputs once
and write the results once, with the same maths in fp32: the normed rows in bf16 (rounded to nearest even, as
``.to(bfloat16)``) and the fp32 gradients. They agree with the torch functions to fp32 rounding (the sums run in
another order; ``tests/test_train_native_fused.py``).

RoPE. :func:`~slick.train.fused_layers.rope` rotates a bf16 ``[tokens, heads, head_dim]`` view in fp32 (a widening
copy, two products, a concatenation of the halves, a sum) and rounds it to bf16, for q and k in forward and again
in backward, where :func:`~slick.train.fused_layers.rope_backward` takes as many kernels on the fp32 gradients;
:meth:`NativeFused.rope_forward` and :meth:`NativeFused.rope_backward` are one pass each, with the same products
and sums.

SwiGLU. :func:`~slick.train.fused_layers.mlp_forward` computes ``silu(g) * u`` on the halves of the bf16 gate/up
product in two kernels, and :func:`~slick.train.fused_layers.mlp_backward` that product, ``da * silu(g)``,
``da * u`` and SiLU's backward in five more; :meth:`NativeFused.swiglu_forward` and
:meth:`NativeFused.swiglu_backward` are one pass each, rounding to bf16 at the same points.

Logprobs. :class:`slick.train.logprobs.FusedLogprobEntropy` turns each chunk of bf16 logits ``[rows, vocab]`` into
fp32, then takes the log-sum-exp, the target's logprob and the entropy, and in backward the closed-form gradient
rounded to bf16, in about ten passes over fp32 ``[rows, vocab]`` tensors. :meth:`NativeFused.logprob_forward` and
:meth:`NativeFused.logprob_backward` read the bf16 logits (twice and once) and write the bf16 gradient once, with
the same formulas in fp32 (``exp`` as a polynomial within 2 ulp, the temperature as a multiplication by its
inverse): the same values to fp32 rounding. Not for soft-capped logits.

Built by :mod:`slick.native_build`; without a compiler, with ``SLICK_NATIVE=0``, or for other dtypes and shapes the
torch paths run.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Optional

import torch

from slick.native_build import load_library

SOURCE = Path(__file__).with_name("csrc") / "fused.cpp"
_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_lock = threading.Lock()
_bound: dict[int, "NativeFused"] = {}    # by id() of the loaded library


def _ptr(t: Optional[torch.Tensor]):
    return None if t is None else t.data_ptr()


class NativeFused:
    """ctypes binding of ``rmsnorm_fwd``/``_bwd``, ``rope_fwd``/``_bwd``, ``swiglu_fwd``/``_bwd`` and
    ``logprob_fwd``/``_bwd``."""

    def __init__(self, lib: ctypes.CDLL):
        self._fwd, self._bwd = lib.rmsnorm_fwd, lib.rmsnorm_bwd
        self._fwd.argtypes = [_P, _P, _P, _P, _I64, _I64, _F32, ctypes.c_int]
        self._bwd.argtypes = [_P, _P, _P, _P, _P, _P, _I64, _I64, ctypes.c_int]
        self._sw_fwd, self._sw_bwd = lib.swiglu_fwd, lib.swiglu_bwd
        self._sw_fwd.argtypes = [_P, _I64, _I64, _P, ctypes.c_int]
        self._sw_bwd.argtypes = [_P, _P, _I64, _I64, _P, _P, ctypes.c_int]
        self._rope_fwd, self._rope_bwd = lib.rope_fwd, lib.rope_bwd
        self._rope_fwd.argtypes = [_P, _I64, _I64, _I64, _I64, _P, _P, _P, ctypes.c_int]
        self._rope_bwd.argtypes = [_P, _I64, _I64, _I64, _P, _P, _P, ctypes.c_int]
        self._lp_fwd, self._lp_bwd = lib.logprob_fwd, lib.logprob_bwd
        self._lp_fwd.argtypes = [_P, _P, _F32, _I64, _I64, _P, _P, _P, ctypes.c_int]
        self._lp_bwd.argtypes = [_P, _P, _F32, _I64, _I64, _P, _P, _P, _P, _P, ctypes.c_int]
        for f in (self._fwd, self._bwd, self._rope_fwd, self._rope_bwd, self._sw_fwd, self._sw_bwd, self._lp_fwd,
                  self._lp_bwd):
            f.restype = None

    @staticmethod
    def norm_applies(x: torch.Tensor, w: torch.Tensor, dt: torch.dtype) -> bool:
        """True for what the kernels cover: a contiguous fp32 CPU ``x [N, H]``, fp32 ``w [H]``, bf16 matmuls."""
        return (dt == torch.bfloat16 and x.dtype == w.dtype == torch.float32 and x.device.type == "cpu"
                and x.dim() == 2 and x.is_contiguous() and w.is_contiguous() and w.shape == (x.shape[1],))

    def norm_forward(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """``(bf16(w * x * r), r [N, 1] fp32)`` with ``r = rsqrt(mean(x^2) + eps)``."""
        N, H = x.shape
        out = torch.empty(N, H, dtype=torch.bfloat16)
        r = torch.empty(N, 1, dtype=torch.float32)
        self._fwd(x.data_ptr(), w.data_ptr(), out.data_ptr(), r.data_ptr(), N, H, eps, torch.get_num_threads())
        return out, r

    def norm_backward(self, x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, dy: torch.Tensor):
        """``(dx [N, H], dw [H])`` in fp32 for the bf16 output gradient ``dy``."""
        N, H = x.shape
        dy = dy.to(torch.bfloat16).contiguous()
        r = r.to(torch.float32).contiguous()
        dx = torch.empty(N, H, dtype=torch.float32)
        dw = torch.empty(H, dtype=torch.float32)
        self._bwd(x.data_ptr(), w.data_ptr(), r.data_ptr(), dy.data_ptr(), dx.data_ptr(), dw.data_ptr(), N, H,
                  torch.get_num_threads())
        return dx, dw

    @staticmethod
    def rope_applies(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """True for ``x [N, heads, D]`` on the CPU with contiguous heads (bf16 for the forward, fp32 for the
        backward) and contiguous fp32 ``cos``/``sin [N, 1, D]``, ``D`` even."""
        N, heads, D = x.shape if x.dim() == 3 else (0, 0, 1)
        return (x.dim() == 3 and x.device.type == "cpu" and D % 2 == 0 and x.stride(2) == 1 and x.stride(1) == D
                and cos.dtype == sin.dtype == torch.float32 and cos.shape == sin.shape == (N, 1, D)
                and cos.is_contiguous() and sin.is_contiguous())

    def rope_forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``rope(x, cos, sin).to(bfloat16)`` for bf16 ``x`` (heads of one row contiguous; rows may be strided)."""
        N, heads, D = x.shape
        out = torch.empty(N, heads, D, dtype=torch.bfloat16)
        self._rope_fwd(x.data_ptr(), x.stride(0), N, heads, D, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                       torch.get_num_threads())
        return out

    def rope_backward(self, g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``rope_backward(g, cos, sin)`` for a contiguous fp32 ``g [N, heads, D]``."""
        N, heads, D = g.shape
        out = torch.empty_like(g)
        self._rope_bwd(g.data_ptr(), N, heads, D, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                       torch.get_num_threads())
        return out

    @staticmethod
    def swiglu_applies(gu: torch.Tensor) -> bool:
        """True for a contiguous bf16 CPU gate/up product ``[N, 2I]``."""
        return gu.dtype == torch.bfloat16 and gu.device.type == "cpu" and gu.dim() == 2 and gu.is_contiguous()

    def swiglu_forward(self, gu: torch.Tensor) -> torch.Tensor:
        """``silu(g) * u`` ``[N, I]`` in bf16 from ``gu = [g | u]``, rounded as torch's bf16 kernels round."""
        N, I2 = gu.shape
        h = torch.empty(N, I2 // 2, dtype=torch.bfloat16)
        self._sw_fwd(gu.data_ptr(), N, I2 // 2, h.data_ptr(), torch.get_num_threads())
        return h

    def swiglu_backward(self, gu: torch.Tensor, da: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(silu(g) * u, [dg | du])`` in bf16 for the gradient ``da [N, I]`` of the product."""
        N, I2 = gu.shape
        da = da.to(torch.bfloat16).contiguous()
        h = torch.empty(N, I2 // 2, dtype=torch.bfloat16)
        dgu = torch.empty(N, I2, dtype=torch.bfloat16)
        self._sw_bwd(gu.data_ptr(), da.data_ptr(), N, I2 // 2, h.data_ptr(), dgu.data_ptr(), torch.get_num_threads())
        return h, dgu

    @staticmethod
    def logprob_applies(h: torch.Tensor, dt: torch.dtype, softcap) -> bool:
        """True where the logprob kernels cover a chunk: bf16 logits on the CPU, no soft cap."""
        return dt == torch.bfloat16 and h.device.type == "cpu" and not softcap

    def logprob_forward(self, z: torch.Tensor, target: torch.Tensor, temperature: float, lse: torch.Tensor,
                        lp: torch.Tensor, ent: Optional[torch.Tensor]) -> None:
        """Fill ``lse``, ``lp`` and (unless None) ``ent`` ``[rows]`` (fp32, contiguous) from the bf16 logits
        ``z [rows, V]`` and the int64 ``target [rows]``."""
        rows, V = z.shape
        z, target = _c(z, torch.bfloat16), _c(target, torch.int64)   # held until the call returns
        self._lp_fwd(_ptr(z), _ptr(target), 1.0 / temperature, rows, V, _ptr(lse), _ptr(lp), _ptr(ent),
                     torch.get_num_threads())

    def logprob_backward(self, z: torch.Tensor, target: torch.Tensor, temperature: float, lse: torch.Tensor,
                         ent: Optional[torch.Tensor], g_lp: Optional[torch.Tensor], g_ent: Optional[torch.Tensor],
                         dz: torch.Tensor) -> None:
        """Write d loss / d logits of the chunk into the bf16 rows ``dz [rows, V]`` (contiguous): ``g_lp`` and
        ``g_ent`` the gradients of its logprobs and entropies (None: no such term; ``ent`` is read with
        ``g_ent``)."""
        rows, V = z.shape
        if dz.dtype != torch.bfloat16 or not dz.is_contiguous() or dz.shape != z.shape:
            raise ValueError("NativeFused.logprob_backward: dz must be contiguous bf16 rows of z's shape")
        f32 = torch.float32
        # contiguous copies where needed, held by these names until the call returns
        z, target, lse = _c(z, torch.bfloat16), _c(target, torch.int64), _c(lse, f32)
        ent, g_lp, g_ent = _c(ent if g_ent is not None else None, f32), _c(g_lp, f32), _c(g_ent, f32)
        self._lp_bwd(_ptr(z), _ptr(target), 1.0 / temperature, rows, V, _ptr(lse), _ptr(ent), _ptr(g_lp),
                     _ptr(g_ent), _ptr(dz), torch.get_num_threads())


def _c(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``t`` contiguous in ``dtype`` (None stays None)."""
    return None if t is None else t.to(dtype).contiguous()


def get() -> Optional[NativeFused]:
    """The kernels, built on first use, or None (no compiler, a failed build, ``SLICK_NATIVE=0``)."""
    # no errno from sqrt and log; 16-lane vectors where the CPU has them (gcc picks 8 lanes by default)
    lib = load_library(SOURCE, "slick_train_fused", "the trainer's RMSNorm, RoPE, SwiGLU and logprob chunks run "
                       "their torch paths", flags=("-fno-math-errno", "-mprefer-vector-width=512"))
    if lib is None:
        return None
    with _lock:
        if id(lib) not in _bound:
            _bound[id(lib)] = NativeFused(lib)
        return _bound[id(lib)]


def get_if(applies: bool) -> Optional[NativeFused]:
    """:func:`get` where ``applies`` (a caller's ``NativeFused.*_applies`` check), else None."""
    return get() if applies else None

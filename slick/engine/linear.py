"""Linear layers for the engine's forward pass, with oneDNN pre-packed weights on CPU.

A decode step multiplies a few dozen rows by every weight matrix of the model, so on CPU it is bound by
reading the weights and by per-call overhead. oneDNN can reorder a weight once into the blocked layout its
kernels read (``torch.ops.mkldnn._reorder_linear_weight``) and fuse an activation, a residual add or a
product into the matmul (``torch.ops.mkldnn._linear_pointwise``): the layer matmuls of SmolLM2-135M at 32
rows take ~30% less time than ``torch.mm`` on the same weights, and the fused epilogues drop separate
elementwise kernels. :class:`Dense` hides which path runs; elsewhere (CUDA, builds without oneDNN) it is a
plain ``mm``/``addmm``.

The packed copy is derived from the weight the model owns (a view of its storage, which weight updates
write into); :meth:`Dense.repack` must run after the weight changes. Once packed, the model may drop its own
copy (``w_t = None``): :meth:`Dense.unpacked` reads the weight back out of the packed one, exactly.
"""
from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.nn.functional as F

log = logging.getLogger("slick.engine")

_lp = _lpb = None   # torch.ops.mkldnn._linear_pointwise and its .binary overload, resolved once (_bind)


def _bind() -> None:
    global _lp, _lpb
    _lp = torch.ops.mkldnn._linear_pointwise.default
    _lpb = torch.ops.mkldnn._linear_pointwise.binary


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """True where oneDNN packed linears are available for this device and dtype (CPU, fp32/bf16)."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    try:  # a tiny self-check: the op exists on this build and agrees with F.linear
        w = torch.randn(8, 16, dtype=dtype)
        x = torch.randn(3, 16, dtype=dtype)
        y = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, 4), None,
                                               "none", [], "")
        return bool(torch.allclose(y.float(), F.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (RuntimeError, NotImplementedError) as e:
        log.info("oneDNN packed linears unavailable (%s); using torch.mm", e)
        return False


class Dense:
    """``y = x @ w_t + b`` for a weight stored transposed (``w_t`` [in, out]), with fused epilogues.

    ``pack``: use the oneDNN path; the packed copy is built by :meth:`repack`, to be called once ``w_t``
    holds its values (until then the plain path runs). ``batch_hint``: the row count the packed layout is
    tuned for (any row count works).
    """

    __slots__ = ("w_t", "b", "pack", "packed", "batch_hint")

    def __init__(self, w_t: Optional[torch.Tensor], b: Optional[torch.Tensor], pack: bool, batch_hint: int = 32):
        self.w_t, self.b, self.pack, self.batch_hint = w_t, b, pack, batch_hint
        self.packed = None

    def repack(self) -> None:
        """Rebuild the packed copy from ``w_t`` (after a weight update). No-op on the plain path."""
        if self.pack:
            if _lp is None:
                _bind()
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.w_t.t().contiguous(), self.batch_hint)

    def unpacked(self) -> torch.Tensor:
        """The weight ``[in, out]`` read back from the packed copy: the identity matrix through the packed
        matmul (each output is one weight times 1 plus zeros, so exact in any dtype)."""
        if self.packed is None:
            raise RuntimeError("Dense.unpacked: nothing is packed")
        eye = torch.eye(self.packed.shape[1], dtype=self.packed.dtype, device=self.packed.device)
        return _lp(eye, self.packed, None, "none", [], "")

    def _mm(self, x2: torch.Tensor) -> torch.Tensor:
        return torch.mm(x2, self.w_t) if self.b is None else torch.addmm(self.b, x2, self.w_t)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return _lp(x, self.packed, self.b, "none", [], "")
        return self._mm(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)

    def silu(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x @ w_t + b)``."""
        if self.packed is not None:
            return _lp(x, self.packed, self.b, "swish", [], "")
        return F.silu(self(x))

    def mul(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``(x @ w_t + b) * other``."""
        if self.packed is not None:
            return _lpb(x, other, self.packed, self.b, "mul")
        return self(x).mul_(other)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """``other + x @ w_t + b`` (a residual connection)."""
        if self.packed is not None:
            return _lpb(x, other, self.packed, self.b, "add")
        y = torch.addmm(other.reshape(-1, other.shape[-1]), x.reshape(-1, x.shape[-1]), self.w_t)
        if self.b is not None:
            y.add_(self.b)
        return y.view(other.shape)

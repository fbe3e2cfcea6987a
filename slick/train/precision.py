"""Device / dtype resolution and the two bf16 training schemes.

Schemes (``Trainer(..., precision=...)``):

* ``"fp32"``      fp32 weights, fp32 compute.
* ``"autocast"``  fp32 master weights in the model, forward/backward under ``torch.autocast(bf16)``;
                  AdamW updates the fp32 weights directly. Each forward re-casts weights to bf16.
                  Default for bf16: weight gradients stay fp32, which learned ~1.5x faster per step on
                  the demo task at about the same tokens/s (see docs/training.md).
* ``"bf16"``      bf16 weights in the model (forward/backward fully bf16, no casts); AdamW runs on
                  separate fp32 master copies. After every micro-batch the bf16 grads are added into
                  fp32 master grads; after the step the master weights are copied back (rounded) into
                  the model. Less memory; bf16 gradients lose small contributions.
"""
from __future__ import annotations

import torch

SCHEMES = ("fp32", "autocast", "bf16")


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available else cpu; anything else is passed to ``torch.device``."""
    if name in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cpu_has_fast_bf16() -> bool:
    """True when the CPU has AVX512-BF16 or AMX-BF16 (bf16 matmuls in hardware)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except Exception:  # older torch: read the flags
        try:
            flags = open("/proc/cpuinfo").read()
        except OSError:
            return False
        return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``"auto"`` -> bf16 on cuda or a bf16-capable CPU, else fp32; ``"bf16"``/``"fp32"`` as given."""
    if name == "bf16":
        return torch.bfloat16
    if name == "fp32":
        return torch.float32
    if name not in (None, "", "auto"):
        raise ValueError(f"unknown dtype '{name}' (choose auto, bf16, fp32)")
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16()):
        return torch.bfloat16
    return torch.float32


def resolve_scheme(dtype: torch.dtype, precision: str | None) -> str:
    """Pick the training scheme for ``dtype`` (``precision`` overrides; must agree with fp32/bf16)."""
    if dtype == torch.float32:
        if precision not in (None, "fp32"):
            raise ValueError(f"precision '{precision}' needs dtype bf16 (got fp32)")
        return "fp32"
    if precision is None:
        return "autocast"
    if precision not in ("autocast", "bf16"):
        raise ValueError(f"unknown bf16 precision scheme '{precision}' (choose autocast, bf16)")
    return precision

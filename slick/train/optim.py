"""AdamW for the trainer and the critic, with its moments optionally kept in bf16 (``--exp-avg-dtype``,
``--exp-avg-sq-dtype``: Megatron's flag names).

With both moments in fp32 (the default) :func:`make_adamw` returns ``torch.optim.AdamW(fused=True)``. With either
in bf16 it returns :class:`LowPrecisionAdamW`: the same fused kernel (``torch._fused_adamw_``), run on
slices of 1M elements whose moments are widened to fp32 for the update and stored back in bf16 with
**stochastic rounding**. Two bf16 moments hold 4 bytes per parameter instead of 8 (0.54 GB less for
SmolLM2-135M). The weights, gradients and the update itself stay fp32.

Why stochastic rounding: ``exp_avg_sq`` moves by ``(1 - beta2) = 0.1%`` of itself per step, less than half
a bf16 ulp (0.2-0.4%), so round-to-nearest would leave it stuck wherever it stands; rounded up with probability
equal to the remainder's share of the ulp, every stored moment is an unbiased estimate of its fp32 value and the
average over steps follows it (``tests/test_train_optim.py``). The random 16 bits come from a fixed table of
2M values made from ``--seed`` at start, read from an offset drawn per slice from a generator seeded by
(``--seed``, step): a resumed run rounds exactly as the uninterrupted one, with no generator state to save.

On CPU, with both moments in bf16 (the CPU default), :func:`make_adamw` gives it the one-pass native kernel of
:mod:`slick.train.native_adamw` (the same update and the same dither, 20 bytes of memory traffic per parameter
instead of about 90); the slices below run where that kernel cannot be built.

The state dict has torch's AdamW layout (``step``, ``exp_avg``, ``exp_avg_sq`` per parameter), so checkpoints
move between the two classes; loading into this one narrows the moments back to their configured dtypes.
Under FSDP the parameters, gradients and moments are DTensors: the update runs on each rank's local shard.
"""
from __future__ import annotations

from typing import Iterable

import torch

from slick.config.groups import TrainConfig
from slick.train import native_adamw

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_SLICE = 1 << 20          # elements per fused-kernel call: its fp32 copies of the moments stay small
_TABLE = 2 * _SLICE       # random 16-bit dither values; a slice reads _SLICE of them from a random offset


def decay_groups(params: Iterable[torch.Tensor], weight_decay: float) -> list:
    """``params`` as optimizer groups: with ``weight_decay`` > 0, the matrices (2-D and up) decay and the vectors
    (biases, norm weights) do not, the rule of Megatron (slime's trainer) and of Hugging Face's Trainer (TRL's);
    with no decay, one group (the layout of earlier checkpoints)."""
    params = list(params)
    if weight_decay <= 0:
        return [{"params": params, "weight_decay": 0.0}]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_adamw(params: Iterable[torch.Tensor], cfg: TrainConfig, lr: float) -> torch.optim.Optimizer:
    """The AdamW of the train group ``cfg`` (``slick.config.groups.TrainConfig``: betas, weight decay of the
    matrices, moment dtypes, seed) over ``params`` at ``lr``."""
    groups = decay_groups(params, cfg.weight_decay)
    kw = dict(lr=lr, betas=(cfg.adam_beta1, cfg.adam_beta2))
    first, second = cfg.exp_avg_dtype or "fp32", cfg.exp_avg_sq_dtype or "fp32"   # unset: fp32 (the plan resolves it)
    if first == "fp32" and second == "fp32":
        return torch.optim.AdamW(groups, fused=True, **kw)
    both_bf16 = first == second == "bf16"
    return LowPrecisionAdamW(groups, exp_avg_dtype=DTYPES[first], exp_avg_sq_dtype=DTYPES[second], seed=cfg.seed,
                             native=native_adamw.load() if both_bf16 else None, **kw)


def stochastic_round_bf16(x: torch.Tensor, dither: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` rounded to a bf16-representable fp32 tensor: its low 16 bits plus ``dither`` (int32 in
    ``[0, 65536)``, ``x``'s shape) carry into the kept bits, then are cleared. Rounds away from zero with
    probability (remainder / ulp), so ``E[result] = x``. A new tensor; ``.to(bfloat16)`` of it is exact."""
    return (x.view(torch.int32) + dither).bitwise_and_(-65536).view(torch.float32)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (shares its storage); any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class LowPrecisionAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, torch's fused maths) with moments stored in the given dtypes."""

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0, *,
                 exp_avg_dtype: torch.dtype = torch.bfloat16, exp_avg_sq_dtype: torch.dtype = torch.bfloat16,
                 seed: int = 0, native=None):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.moment_dtypes = {"exp_avg": exp_avg_dtype, "exp_avg_sq": exp_avg_sq_dtype}
        self.seed = int(seed)
        # slick.train.native_adamw.NativeAdamW: one pass per CPU parameter when both moments are bf16
        self.native = native if exp_avg_dtype == exp_avg_sq_dtype == torch.bfloat16 else None
        gen = torch.Generator().manual_seed(self.seed)
        self._dither = torch.randint(0, 65536, (_TABLE,), dtype=torch.int32, generator=gen)

    def _state(self, p: torch.Tensor) -> dict:
        st = self.state[p]
        if not st:
            st["step"] = torch.tensor(0.0)
            for k, dt in self.moment_dtypes.items():
                st[k] = torch.zeros_like(p, dtype=dt, memory_format=torch.preserve_format)
        return st

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)   # torch casts the moments to the parameters' dtype
        for st in self.state.values():
            for k, dt in self.moment_dtypes.items():
                if k in st and st[k].dtype != dt:
                    st[k] = st[k].to(dt)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("LowPrecisionAdamW.step takes no closure")
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self._state(p)
                st["step"] += 1
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + int(st["step"]))
                locals_ = [_local(t) for t in (p, p.grad, st["exp_avg"], st["exp_avg_sq"])]
                if not all(t.is_contiguous() for t in locals_):
                    raise ValueError(f"LowPrecisionAdamW: a parameter of shape {tuple(p.shape)} or its gradient "
                                     "is not contiguous (its update would be written to a copy)")
                w, g, m, v = (t.view(-1) for t in locals_)
                if self.native is not None and w.device.type == "cpu" and w.dtype == g.dtype == torch.float32:
                    # the offsets the torch path below would draw: per slice, the first moment's, then the second's
                    offs = torch.randint(0, _TABLE - _SLICE + 1, (2 * -(-w.numel() // _SLICE),), generator=gen)
                    self.native.step(w, g, m, v, _SLICE, self._dither, offs[0::2].contiguous(),
                                     offs[1::2].contiguous(), lr=group["lr"], beta1=beta1, beta2=beta2,
                                     eps=group["eps"], weight_decay=group["weight_decay"], step=int(st["step"]))
                    continue
                for s in range(0, w.numel(), _SLICE):
                    sl = slice(s, s + _SLICE)
                    m32, v32 = m[sl].float(), v[sl].float()   # copies when bf16, views when fp32
                    torch._fused_adamw_([w[sl]], [g[sl]], [m32], [v32], [], [st["step"]], lr=group["lr"],
                                        beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                                        eps=group["eps"], amsgrad=False, maximize=False)
                    for dst, src in ((m, m32), (v, v32)):
                        if dst.dtype == torch.bfloat16:
                            off = int(torch.randint(0, _TABLE - _SLICE + 1, (1,), generator=gen))
                            dst[sl] = stochastic_round_bf16(src, self._dither[off:off + src.numel()])
        return None

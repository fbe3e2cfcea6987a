"""slick.train.native_adamw: the one-pass AdamW kernel with bf16 moments agrees with LowPrecisionAdamW's torch
path (same update to fp32 rounding, same stochastic rounding with the same dither), and make_adamw uses it."""
import pytest
import torch

from slick.config import Config
from slick.configure.validate import validate_config
from slick.train import native_adamw
from slick.train.optim import LowPrecisionAdamW, make_adamw
from tests.native_required import require
from tests.test_train_optim import _params, _run

K = native_adamw.load()


@pytest.fixture()
def kernel():
    return require(K, "native AdamW")


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_the_native_step_agrees_with_the_torch_path(kernel, weight_decay):
    """Three steps; before each the native optimizer takes the torch path's weights and moments, so every step
    (non-zero moments and bias corrections included) is compared from the same state."""
    kw = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=weight_decay, seed=7)
    a, grads = _params()
    b = [p.detach().clone().requires_grad_(True) for p in a]
    torch_path, native = LowPrecisionAdamW(a, **kw), LowPrecisionAdamW(b, native=kernel, **kw)
    for gs in grads:
        with torch.no_grad():
            for pa, pb in zip(a, b):
                pb.copy_(pa)
                if pa in torch_path.state:
                    native.state[pb] = {k: v.clone() for k, v in torch_path.state[pa].items()}
        start = [p.detach().clone() for p in a]
        before = [{k: v.float().clone() for k, v in torch_path.state[p].items()} if p in torch_path.state
                  else {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)} for p in a]
        _run(torch_path, a, [gs])
        _run(native, b, [gs])
        for p0, prev, gr, pa, pb in zip(start, before, gs, a, b):
            assert not torch.equal(pa, p0)
            assert float((pa - pb).detach().abs().max()) <= 1e-6     # the same fp32 update, to rounding
            for k in ("exp_avg", "exp_avg_sq"):
                ma, mb = torch_path.state[pa][k], native.state[pb][k]
                assert ma.dtype == mb.dtype == torch.bfloat16
                # the same dither: an element differs only where fp32 rounding moved the value across a rounding
                # boundary (a different dither would change about half of them), by one bf16 ulp plus that fp32
                # rounding, which shows where the new moment nearly cancels (|m| << |g|)
                assert (ma == mb).float().mean().item() > 0.999
                ulp = torch.maximum(ma.float().abs(), mb.float().abs()) * 2.0 ** -7
                fp32 = 1e-6 * (prev[k].abs() + gr.abs() + gr * gr)
                assert bool(((ma.float() - mb.float()).abs() <= ulp + fp32).all())
    assert float(native.state[b[2]]["step"]) == 3.0


def test_the_native_step_keeps_stochastic_rounding_where_nearest_stalls(kernel):
    n, steps, beta2 = 4096, 3000, 0.999
    p = torch.zeros(n, requires_grad=True)
    opt = LowPrecisionAdamW([p], lr=0.0, betas=(0.9, beta2), seed=5, native=kernel)
    p.grad = torch.full((n,), 0.5)
    for _ in range(steps):
        opt.step()
    exact = 0.25 * (1 - beta2 ** steps)
    assert abs(opt.state[p]["exp_avg_sq"].float().mean().item() / exact - 1) < 0.01


def test_bad_inputs_are_refused_by_the_kernel(kernel):
    w, g = torch.zeros(8), torch.zeros(8)
    m, v = torch.zeros(8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    dither, offs = torch.zeros(16, dtype=torch.int32), torch.zeros(1, dtype=torch.int64)
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1)
    with pytest.raises(ValueError, match="fp32"):
        kernel.step(w, g, m.float(), v, 8, dither, offs, offs, **kw)
    with pytest.raises(ValueError, match="one length"):
        kernel.step(w, g[:4], m, v, 8, dither, offs, offs, **kw)
    with pytest.raises(ValueError, match="past the dither table"):
        kernel.step(w, g, m, v, 8, dither, offs + 9, offs, **kw)
    kernel.step(w, g, m, v, 8, dither, offs, offs, **kw)     # the good call runs


@pytest.mark.parametrize("moments,native", [("bf16", True), ("fp32", False)])
def test_make_adamw_uses_the_kernel_for_bf16_moments(kernel, moments, native):
    cfg = validate_config(Config.from_flat(dict(hf_checkpoint="x", exp_avg_dtype=moments, exp_avg_sq_dtype=moments,
                                                rm_type="exact")), check_files=False)
    opt = make_adamw([torch.zeros(3, requires_grad=True)], cfg.train, lr=1e-3)
    assert (getattr(opt, "native", None) is not None) is native

"""slick.train.native_norm: the trainer's one-pass RMSNorm kernels agree with the torch functions of
slick.train.fused_layers (forward in bf16, backward in fp32, to fp32 rounding), and the fused layers use them
exactly where they apply."""
import pytest
import torch

from slick.train import fused_layers, native_norm
from slick.train.fused_layers import rms_norm, rms_norm_backward, rms_norm_to
from tests.native_required import require

K = native_norm.get()


@pytest.fixture()
def kernel():
    return require(K, "native RMSNorm")


def _inputs(n=301, h=576, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g) * torch.logspace(-3, 2, n).view(-1, 1)   # rows of very different scales
    x[7] = 0.0                                                                    # a zero row: r = 1/sqrt(eps)
    w = torch.randn(h, generator=g)
    dy = torch.randn(n, h, generator=g).to(torch.bfloat16)
    return x, w, dy


def _reference_backward(x, w, r, dy):
    """rms_norm_backward's formula in float64."""
    x, w, r, dy = x.double(), w.double(), r.double(), dy.double()
    xhat, g = x * r, dy * w
    return r * (g - xhat * (g * xhat).mean(-1, keepdim=True)), (dy * xhat).sum(0)


def test_forward_equals_the_torch_norm_cast_to_bf16(kernel):
    x, w, _ = _inputs()
    n_ref, r_ref = rms_norm(x, w, 1e-5)
    n, r = kernel.forward(x, w, 1e-5)
    assert n.dtype == torch.bfloat16 and n.shape == x.shape and r.shape == (x.shape[0], 1)
    assert float(((r - r_ref).abs() / r_ref).max()) < 1e-6
    # r may differ in its last bit (the sum of squares runs in another order): a product then rounds to the
    # other neighbour in bf16 only where it lies on a rounding boundary, by one bf16 ulp
    n_ref = n_ref.to(torch.bfloat16)
    diff = n != n_ref
    assert float(diff.float().mean()) < 1e-3
    ulp = n_ref.float().abs()[diff] * 2.0 ** -7
    assert bool(((n.float() - n_ref.float()).abs()[diff] <= ulp * 1.01).all())
    assert bool((n[7] == 0).all()) and float(r[7]) == pytest.approx(1e-5 ** -0.5, rel=1e-6)


def test_backward_equals_the_formula_in_float64(kernel):
    x, w, dy = _inputs()
    r = rms_norm(x, w, 1e-5)[1]
    dx, dw = kernel.backward(x, w, r, dy)
    dx_ref, dw_ref = _reference_backward(x, w, r, dy)
    assert dx.dtype == dw.dtype == torch.float32
    # per row, to fp32 rounding of the row's largest term
    row_scale = dx_ref.abs().amax(-1, keepdim=True) + r.double() * w.double().abs().max() * 1e-6
    assert float(((dx.double() - dx_ref).abs() / row_scale).max()) < 1e-5
    # dw sums 301 rows of very different scales: to fp32 rounding of the sum of magnitudes
    mag = (dy.double() * x.double() * r.double()).abs().sum(0)
    assert float(((dw.double() - dw_ref).abs() / mag).max()) < 1e-5
    again = kernel.backward(x, w, r, dy)
    assert torch.equal(again[0], dx) and torch.equal(again[1], dw)     # one thread count: the same bits


def test_the_fused_layers_use_the_kernels_only_where_they_apply(kernel, monkeypatch):
    x, w, dy = _inputs(n=64, h=64)
    calls = []
    real = native_norm.get

    def counting():
        calls.append(1)
        return real()
    monkeypatch.setattr(native_norm, "get", counting)
    n, r = rms_norm_to(x, w, 1e-5, torch.bfloat16)
    dx, dw = rms_norm_backward(x, w, r, dy)
    assert len(calls) == 2 and torch.equal(n, kernel.forward(x, w, 1e-5)[0])
    assert torch.equal(dx, kernel.backward(x, w, r, dy)[0])
    # float64 (the gradient checks), fp32 output gradients (q/k norms) and 3-D inputs keep the torch path
    x64, w64 = x.double(), w.double()
    n64, r64 = rms_norm_to(x64, w64, 1e-5, torch.float64)
    assert torch.equal(n64, rms_norm(x64, w64, 1e-5)[0])
    rms_norm_backward(x, w, r, dy.float())
    rms_norm_to(x.view(4, 16, 64), w, 1e-5, torch.bfloat16)
    assert len(calls) == 2


def test_a_fused_layer_step_matches_the_torch_norms(kernel, monkeypatch):
    """One MLP block forward and backward: the same outputs and gradients with the torch norms, to bf16 rounding."""
    torch.manual_seed(0)
    H, I, N = 64, 128, 50
    x, a = torch.randn(N, H), torch.randn(N, H).to(torch.bfloat16)
    params = [torch.randn(H), torch.randn(I, H) * 0.1, torch.randn(I, H) * 0.1, torch.randn(H, I) * 0.1]

    def run():
        ps = [p.clone().requires_grad_(True) for p in params]
        xx = x.clone().requires_grad_(True)
        y = fused_layers.MLPBlock.apply(xx, a, 1e-5, torch.bfloat16, False, *ps)
        y.backward(torch.ones_like(y))
        return y.detach(), xx.grad, [p.grad for p in ps]
    y1, gx1, gp1 = run()
    monkeypatch.setattr(native_norm, "get", lambda: None)
    y0, gx0, gp0 = run()
    assert not torch.equal(gx0, torch.zeros_like(gx0))
    assert torch.allclose(y1, y0, rtol=2e-2, atol=2e-2)
    assert torch.allclose(gx1, gx0, rtol=2e-2, atol=2e-2)
    for g1, g0 in zip(gp1, gp0):
        assert torch.allclose(g1, g0, rtol=2e-2, atol=2e-2 * float(g0.abs().max()))

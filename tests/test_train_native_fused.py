"""slick.train.native_fused: the trainer's one-pass RMSNorm and logprob kernels agree with the torch paths of
slick.train.fused_layers and slick.train.logprobs (to fp32 rounding, bf16 results to bf16 rounding), and are used
exactly where they apply."""
import pytest
import torch

from slick.train import fused_layers, native_fused
from slick.train.fused_layers import rms_norm, rms_norm_backward, rms_norm_to
from tests.native_required import require

K = native_fused.get()


@pytest.fixture()
def kernel():
    return require(K, "native fused kernels")


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
    n, r = kernel.norm_forward(x, w, 1e-5)
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
    dx, dw = kernel.norm_backward(x, w, r, dy)
    dx_ref, dw_ref = _reference_backward(x, w, r, dy)
    assert dx.dtype == dw.dtype == torch.float32
    # per row, to fp32 rounding of the row's largest term
    row_scale = dx_ref.abs().amax(-1, keepdim=True) + r.double() * w.double().abs().max() * 1e-6
    assert float(((dx.double() - dx_ref).abs() / row_scale).max()) < 1e-5
    # dw sums 301 rows of very different scales: to fp32 rounding of the sum of magnitudes
    mag = (dy.double() * x.double() * r.double()).abs().sum(0)
    assert float(((dw.double() - dw_ref).abs() / mag).max()) < 1e-5
    again = kernel.norm_backward(x, w, r, dy)
    assert torch.equal(again[0], dx) and torch.equal(again[1], dw)     # one thread count: the same bits


def test_the_fused_layers_use_the_kernels_only_where_they_apply(kernel, monkeypatch):
    x, w, dy = _inputs(n=64, h=64)
    calls = []
    real = native_fused.get

    def counting():
        calls.append(1)
        return real()
    monkeypatch.setattr(native_fused, "get", counting)
    n, r = rms_norm_to(x, w, 1e-5, torch.bfloat16)
    dx, dw = rms_norm_backward(x, w, r, dy)
    assert len(calls) == 2 and torch.equal(n, kernel.norm_forward(x, w, 1e-5)[0])
    assert torch.equal(dx, kernel.norm_backward(x, w, r, dy)[0])
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
    monkeypatch.setattr(native_fused, "get", lambda: None)
    y0, gx0, gp0 = run()
    assert not torch.equal(gx0, torch.zeros_like(gx0))
    assert torch.allclose(y1, y0, rtol=2e-2, atol=2e-2)
    assert torch.allclose(gx1, gx0, rtol=2e-2, atol=2e-2)
    for g1, g0 in zip(gp1, gp0):
        assert torch.allclose(g1, g0, rtol=2e-2, atol=2e-2 * float(g0.abs().max()))


def _logprob_run(h, head, targets, temperature, g_lp, g_ent, native: bool, monkeypatch):
    """Logprobs, entropies and the gradients of ``g_lp . lp + g_ent . ent`` through chunked_logprobs (chunks of
    16: several weight-gradient groups), with the native kernels or the torch path."""
    from slick.train import logprobs

    if not native:
        monkeypatch.setattr(native_fused, "get", lambda: None)
    hh = h.clone().requires_grad_(True)
    head.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, ent = logprobs.chunked_logprobs(hh, head, targets, temperature, 16, True, g_ent is not None)
    ((lp * g_lp).sum() + ((ent * g_ent).sum() if g_ent is not None else 0)).backward()
    monkeypatch.undo()
    return lp.detach(), ent.detach(), hh.grad, head.weight.grad.clone()


@pytest.mark.parametrize("temperature,entropy", [(1.0, True), (0.7, True), (1.0, False)])
def test_logprob_chunks_agree_with_the_torch_path(kernel, monkeypatch, temperature, entropy):
    g = torch.Generator().manual_seed(1)
    n, H, V = 70, 32, 1000
    h = torch.randn(n, H, generator=g)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g) * 0.3)
    targets = torch.randint(0, V, (n,), generator=g)
    g_lp = torch.randn(n, generator=g)
    g_ent = torch.randn(n, generator=g) * 0.1 if entropy else None
    calls = []
    real = native_fused.get
    monkeypatch.setattr(native_fused, "get", lambda: calls.append(1) or real())
    nat = _logprob_run(h, head, targets, temperature, g_lp, g_ent, True, monkeypatch)
    assert len(calls) == 2                                # forward and backward took the kernels
    ref = _logprob_run(h, head, targets, temperature, g_lp, g_ent, False, monkeypatch)
    lp, ent, dh, dw = nat
    assert float((lp - ref[0]).abs().max()) < 1e-4 and float((ent - ref[1]).abs().max()) < 1e-4
    # the bf16 logit gradient may round the other way where fp32 rounding moved a value: to bf16 rounding
    assert float((dh - ref[2]).abs().max()) <= 1e-2 * float(ref[2].abs().max())
    assert float((dw - ref[3]).abs().max()) <= 1e-2 * float(ref[3].abs().max())
    assert float(ref[2].abs().max()) > 0 and float(ref[3].abs().max()) > 0


def test_logprob_kernels_by_hand(kernel):
    """One row of three logits [0, ln 2, ln 4] (p = 1/7, 2/7, 4/7): lse = ln 7, lp of the last = ln(4/7), entropy
    = -sum p ln p; the gradient of lp[target] alone is onehot - p."""
    import math

    z = torch.tensor([[0.0, math.log(2), math.log(4)]]).to(torch.bfloat16)
    zf = z.float()
    t = torch.tensor([2])
    lse, lp, ent = torch.empty(1), torch.empty(1), torch.empty(1)
    kernel.logprob_forward(z, t, 1.0, lse, lp, ent)
    p = torch.softmax(zf[0], -1)
    assert float(lse) == pytest.approx(float(torch.logsumexp(zf[0], -1)), abs=2e-6)
    assert float(lp) == pytest.approx(float(zf[0, 2] - torch.logsumexp(zf[0], -1)), abs=2e-6)
    assert float(ent) == pytest.approx(float(-(p * p.log()).sum()), abs=2e-6)
    dz = torch.empty(1, 3, dtype=torch.bfloat16)
    kernel.logprob_backward(z, t, 1.0, lse, None, torch.ones(1), None, dz)
    want = (torch.nn.functional.one_hot(t, 3)[0] - p).to(torch.bfloat16)
    assert torch.equal(dz[0], want)


def test_swiglu_kernels_round_as_torch_does(kernel):
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(2)
    N, I = 37, 96
    gu = (torch.randn(N, 2 * I, generator=g) * 4).to(torch.bfloat16)
    gu[0, :4] = torch.tensor([0.0, -30.0, 30.0, 1e-3])
    da = torch.randn(N, I, generator=g).to(torch.bfloat16)
    gate, up = gu.chunk(2, -1)
    sg = F.silu(gate)
    want_h, want_du = sg * up, da * sg
    want_dg = torch.ops.aten.silu_backward(da * up, gate)
    h = kernel.swiglu_forward(gu)
    h2, dgu = kernel.swiglu_backward(gu, da)
    dg, du = dgu.chunk(2, -1)
    for got, want in ((h, want_h), (h2, want_h), (du, want_du), (dg, want_dg)):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        differ = got != want
        # exp is a polynomial here: a value may round to the other bf16 neighbour, by one ulp, rarely
        assert float(differ.float().mean()) < 2e-3
        assert bool(((got.float() - want.float()).abs()[differ] <= want.float().abs()[differ] * 2.0 ** -7 * 1.01).all())


def test_the_mlp_uses_the_swiglu_kernels(kernel, monkeypatch):
    """mlp_forward / mlp_backward with the native SwiGLU equal the torch path's outputs and gradients (bf16)."""
    from slick.train.fused_layers import mlp_backward, mlp_forward

    g = torch.Generator().manual_seed(3)
    H, I, N = 64, 96, 40
    h = torch.randn(N, H, generator=g)
    ws = [torch.randn(H, generator=g), torch.randn(I, H, generator=g) * 0.2, torch.randn(I, H, generator=g) * 0.2,
          torch.randn(H, I, generator=g) * 0.2]
    dy = torch.randn(N, H, generator=g)
    y1, r1, gu1 = mlp_forward(h, 1e-5, torch.bfloat16, *ws)
    b1 = mlp_backward(h, r1, None, dy, 1e-5, torch.bfloat16, *ws)
    monkeypatch.setattr(native_fused, "get", lambda: None)
    y0, r0, gu0 = mlp_forward(h, 1e-5, torch.bfloat16, *ws)
    b0 = mlp_backward(h, r0, None, dy, 1e-5, torch.bfloat16, *ws)
    assert torch.equal(gu1, gu0) or float((gu1.float() - gu0.float()).abs().max()) < 0.05
    assert torch.allclose(y1.float(), y0.float(), rtol=2e-2, atol=2e-2)
    for a, b in zip(b1, b0):
        assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2 * float(b.float().abs().max()))


def test_rope_kernels_match_the_torch_rotation(kernel, monkeypatch):
    from slick.train.fused_layers import rope, rope_backward, rope_to

    g = torch.Generator().manual_seed(4)
    N, H, KV, D = 33, 6, 2, 16
    qkv = torch.randn(N, (H + 2 * KV) * D, generator=g).to(torch.bfloat16)
    q = qkv[:, :H * D].view(N, H, D)                       # a strided view of the qkv rows, as the layer passes
    ang = torch.randn(N, 1, D, generator=g) * 3
    cos, sin = ang.cos(), ang.sin()
    want = rope(q, cos, sin).to(torch.bfloat16)
    got = rope_to(q, cos, sin, torch.bfloat16)
    differ = got != want
    assert float(differ.float().mean()) < 2e-3           # a sum may round to the other bf16 neighbour, rarely
    assert bool(((got.float() - want.float()).abs()[differ] <= want.float().abs()[differ] * 2.0 ** -7 * 1.01).all())
    # by hand, D = 2: (x0, x1) -> (x0 cos0 - x1 sin0, x1 cos1 + x0 sin1)
    x = torch.tensor([[[1.0, 2.0]]]).to(torch.bfloat16)
    c, s = torch.tensor([[[0.5, 0.25]]]), torch.tensor([[[0.75, -1.0]]])
    assert rope_to(x, c, s, torch.bfloat16).float().tolist() == [[[1.0 * 0.5 - 2.0 * 0.75, 2.0 * 0.25 + 1.0 * -1.0]]]
    gr = torch.randn(N, H, D, generator=g)
    native = rope_backward(gr, cos, sin)
    monkeypatch.setattr(native_fused, "get", lambda: None)
    assert float((native - rope_backward(gr, cos, sin)).abs().max()) < 1e-5
    # the backward is the transpose: <rope(x), g> == <x, rope_backward(g)>
    xf = torch.randn(N, H, D, generator=g, dtype=torch.float64)
    lhs = (rope(xf, cos.double(), sin.double()) * gr.double()).sum()
    assert float(lhs) == pytest.approx(float((xf * native.double()).sum()), rel=1e-5)

"""slick.fastmath: exp and logsumexp through exp2 equal torch's within fp32 rounding of x * log2(e)."""
import math

import torch

from slick.fastmath import exp, exp_, logsumexp


def test_exp_matches_torch_within_the_stated_relative_error():
    x = torch.linspace(-80, 80, 100_001, dtype=torch.float32)
    ref = x.double().exp()
    got = exp(x).double()
    rel = ((got - ref).abs() / ref).max().item()
    # bound: |x| * 2^-24 * ln2-ish rounding of x * log2e plus two fp32 roundings; at |x| <= 80: < 1.2e-5
    assert rel < 80 * 1.5e-7, rel
    y = x.clone()
    assert exp_(y) is y and torch.equal(y, exp(x))
    special = torch.tensor([float("-inf"), 0.0, float("inf")])
    assert exp(special).tolist() == [0.0, 1.0, float("inf")] and math.isnan(exp(torch.tensor(float("nan"))).item())


def test_logsumexp_matches_torch_including_masked_and_infinite_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 300, generator=g) * 20
    x[0, 0] = float("-inf")                     # a fully masked row
    x[1, 2, :150] = float("-inf")               # half masked
    x[2, 3, 7] = float("inf")
    for dim, keep in ((-1, False), (-1, True), (1, True), (0, False)):
        a, b = logsumexp(x, dim, keep), torch.logsumexp(x, dim, keep)
        assert a.shape == b.shape
        fin = torch.isfinite(b)
        assert torch.equal(fin, torch.isfinite(a)) and torch.equal(a[~fin], b[~fin])
        assert torch.allclose(a[fin], b[fin], rtol=2e-6, atol=2e-6), (a[fin] - b[fin]).abs().max()
    assert logsumexp(x)[0, 0].item() == float("-inf") and logsumexp(x)[2, 3].item() == float("inf")

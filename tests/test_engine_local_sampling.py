"""slick.engine.sampling against hand-computed distributions."""
import math

import pytest
import torch

from slick.engine.sampling import sample

from .stats import assert_frequencies


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def test_greedy_and_logprob_values():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tok, lp = sample(logits, [0, 0], [1.0, 1.0], [-1, -1], gens(2))
    assert tok == [1, 0]
    z0 = math.log(1 + math.exp(2) + math.exp(1))
    z1 = math.log(math.exp(3) + 2)
    assert abs(lp[0] - (2 - z0)) < 1e-6 and abs(lp[1] - (3 - z1)) < 1e-6


def test_temperature_logprob_is_before_truncation():
    logits = torch.tensor([[0.0, 2.0, 1.0]])
    tok, lp = sample(logits, [0.5], [1.0], [1], gens(1))     # top_k=1 -> must pick token 1
    assert tok == [1]
    s = [0.0, 4.0, 2.0]                                      # logits / 0.5
    want = 4.0 - math.log(sum(math.exp(x) for x in s))       # untruncated log_softmax
    assert abs(lp[0] - want) < 1e-6


P = torch.tensor([0.5, 0.3, 0.15, 0.05])
N = 4000


def draw(n=N, temperature=1.0, top_p=1.0, top_k=-1, seed=11, logits=None):
    logits = P.log().repeat(n, 1) if logits is None else logits
    tok, _ = sample(logits, [temperature] * n, [top_p] * n, [top_k] * n, gens(n, seed=seed))
    return tok


def test_frequencies_follow_softmax_temperature_and_truncation():
    """Chi-square goodness of fit at alpha = 1e-4 (tests/stats.py), 4000 draws per case."""
    assert_frequencies(draw(seed=11), P)
    # T=0.5: softmax(log p / 0.5) is p^2 renormalised
    assert_frequencies(draw(temperature=0.5, seed=15), P ** 2 / (P ** 2).sum())
    # top_k=2: only {0,1}, renormalised 0.625 / 0.375
    assert_frequencies(draw(top_k=2, seed=12), [0.625, 0.375, 0.0, 0.0])
    # top_p=0.7: mass before token 2 is 0.8 >= 0.7 -> nucleus {0,1}; top_p=0.85 -> {0,1,2}
    assert_frequencies(draw(top_p=0.7, seed=13), [0.625, 0.375, 0.0, 0.0])
    assert_frequencies(draw(top_p=0.85, seed=14), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    # temperature then truncation: T=0.5 gives p^2 / 0.365 = [0.685, 0.247, 0.062, 0.007]; top_p=0.9 -> {0,1}
    assert_frequencies(draw(temperature=0.5, top_p=0.9, seed=16), [0.25 / 0.34, 0.09 / 0.34, 0.0, 0.0])


def test_frequency_check_rejects_a_halved_token():
    """The check has power: a sampler that draws token 3 at 0.025 instead of 0.05 fails it."""
    wrong = P.clone()
    wrong[3] /= 2
    tok = draw(seed=11, logits=(wrong / wrong.sum()).log().repeat(N, 1))
    with pytest.raises(AssertionError, match="do not fit"):
        assert_frequencies(tok, P)
    assert_frequencies(tok, wrong / wrong.sum())       # the same draws fit the distribution they came from
    with pytest.raises(AssertionError, match="probability 0 were drawn"):
        assert_frequencies(draw(seed=11), [0.625, 0.375, 0.0, 0.0])


def test_rows_are_independent_of_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 1000)
    temps, ps, ks = [1.0, 0, 0.7, 1.3, 1.0, 0.9], [1.0, 1.0, 0.9, 1.0, 0.5, 1.0], [-1, -1, 40, -1, -1, 5]
    full, lp_full = sample(logits, temps, ps, ks, gens(6, seed=3))
    for i in range(6):
        g = torch.Generator().manual_seed(3 + i)
        one, lp_one = sample(logits[i:i + 1], [temps[i]], [ps[i]], [ks[i]], [g])
        assert one[0] == full[i] and abs(lp_one[0] - lp_full[i]) < 1e-6

"""slick.engine.sampling against hand-computed distributions."""
import math

import torch

from slick.engine.sampling import sample


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


def test_frequencies_follow_softmax_and_truncation():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    logits = p.log().repeat(n, 1)
    g = gens(n, seed=11)
    tok, _ = sample(logits, [1.0] * n, [1.0] * n, [-1] * n, g)
    freq = torch.bincount(torch.tensor(tok), minlength=4).float() / n
    assert torch.allclose(freq, p, atol=0.03), freq
    # top_k=2: only {0,1}, renormalised 0.625 / 0.375
    tok, _ = sample(logits, [1.0] * n, [1.0] * n, [2] * n, gens(n, seed=12))
    freq = torch.bincount(torch.tensor(tok), minlength=4).float() / n
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.625) < 0.03
    # top_p=0.7: mass before token 2 is 0.8 >= 0.7 -> nucleus {0,1}; top_p=0.85 -> {0,1,2}
    tok, _ = sample(logits, [1.0] * n, [0.7] * n, [-1] * n, gens(n, seed=13))
    assert set(tok) == {0, 1}
    tok, _ = sample(logits, [1.0] * n, [0.85] * n, [-1] * n, gens(n, seed=14))
    assert set(tok) == {0, 1, 2}


def test_rows_are_independent_of_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 1000)
    temps, ps, ks = [1.0, 0, 0.7, 1.3, 1.0, 0.9], [1.0, 1.0, 0.9, 1.0, 0.5, 1.0], [-1, -1, 40, -1, -1, 5]
    full, lp_full = sample(logits, temps, ps, ks, gens(6, seed=3))
    for i in range(6):
        g = torch.Generator().manual_seed(3 + i)
        one, lp_one = sample(logits[i:i + 1], [temps[i]], [ps[i]], [ks[i]], [g])
        assert one[0] == full[i] and abs(lp_one[0] - lp_full[i]) < 1e-6

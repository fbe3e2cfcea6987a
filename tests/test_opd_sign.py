"""The OPD term's sign and scale on a small batch, by hand (slick/algo/distill.py, slick/algo/assemble.py): the
per-token term is coef x (teacher - student logprob) less its mean over the batch's trained tokens, so a token
the teacher likes better than the student does (relative to the batch) gets a positive advantage, and a batch
whose every token has the same gap gets none."""
import pytest
import torch

from slick.algo.distill import add_opd_terms, centred_opd_terms, opd_metrics

T = [torch.tensor([-1.0, -2.0, -0.5]), torch.tensor([-3.0, -1.0, -9.0])]
S = [torch.tensor([-1.5, -1.0, -0.5]), torch.tensor([-2.0, -4.0, -1.0])]
MASKS = [[1, 1, 0], [1, 1, 1]]


def test_the_centred_term_by_hand():
    # raw terms, coef 2: [1, -2, (0)], [-2, 6, -16]; mean over the 5 trained tokens: -13/5 = -2.6
    out = add_opd_terms([torch.zeros(3), torch.zeros(3)], T, S, MASKS, 2.0, centre=True)
    want = [[3.6, 0.6, 0.0], [0.6, 8.6, -13.4]]
    for got, w in zip(out, want):
        assert got.tolist() == pytest.approx(w, abs=1e-6)
    # sign: the first token (teacher -1.0 vs student -1.5) is above the batch's mean gap: raised
    assert out[0][0] > 0 and out[1][2] < 0
    assert sum(float((o * torch.tensor(m, dtype=torch.float32)).sum()) for o, m in zip(out, MASKS)) == \
        pytest.approx(0.0, abs=1e-5)
    # beside an estimator's advantages (GRPO's +1 / -1): added, not replacing them
    beside = add_opd_terms([torch.ones(3), -torch.ones(3)], T, S, MASKS, 2.0, centre=True)
    assert [b.tolist() for b in beside] == [pytest.approx([4.6, 1.6, 1.0], abs=1e-6),
                                           pytest.approx([-0.4, 7.6, -14.4], abs=1e-6)]
    # the metric is the raw per-token gap, student - teacher: 6.5 / 5 = 1.3 = -(mean raw term) / coef
    assert opd_metrics(T, S, MASKS)["opd/kl"] == pytest.approx(1.3)


def test_a_uniform_gap_is_no_signal_and_coef_zero_is_exactly_zero():
    t = [torch.tensor([-4.0, -5.0]), torch.tensor([-6.0, -7.0])]
    s = [x + 3.0 for x in t]   # every token: student 3 nats above the teacher (the reported KL ~3.3)
    raw = add_opd_terms([torch.zeros(2)] * 2, t, s, [[1, 1], [1, 1]], 1.0)
    assert [r.tolist() for r in raw] == [[-3.0, -3.0], [-3.0, -3.0]]   # without the baseline: all pushed down
    centred = add_opd_terms([torch.zeros(2)] * 2, t, s, [[1, 1], [1, 1]], 1.0, centre=True)
    assert [c.tolist() for c in centred] == [[0.0, 0.0], [0.0, 0.0]]
    adv = [torch.tensor([0.3, -0.7]), torch.tensor([0.1, 0.2])]
    zero = add_opd_terms(adv, t, s, [[1, 1], [1, 0]], 0.0, centre=True)
    assert all(torch.equal(a, z) for a, z in zip(adv, zero))   # coef 0: the estimator's, bit for bit
    assert centred_opd_terms([torch.tensor([1.0, 2.0])], [[0, 1]])[0].tolist() == [0.0, 0.0]   # masked: 0

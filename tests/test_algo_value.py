"""The critic's math by hand: GAE over tool tokens in the middle of a response, the clipped value loss and its
gradient, explained variance (slick/algo/value.py, slick/algo/returns.py)."""

import pytest
import torch

from tests.algo_params import params
from slick.algo import AdvantageInputs, explained_variance, gae, ppo, value_loss


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=tol)


# Row 0: counted tokens t0, t3, t5; tool tokens t1, t2, t4 (mask 0) carry values 5 and rewards 3 that must be ignored.
# Row 1: a tool token first, two counted tokens, then tool tokens/padding to the end; rewards 7 off the mask.
G_MASK = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0, 0.0, 0.0]])
G_VALUES = torch.tensor([[0.2, 5.0, 5.0, 0.4, 5.0, 0.5], [9.0, 1.0, 2.0, 9.0, 9.0, 9.0]])
G_REWARDS = torch.tensor([[0.0, 3.0, 3.0, 0.0, 3.0, 1.0], [7.0, 0.0, 2.0, 7.0, 7.0, 7.0]])


def test_gae_skips_tool_tokens_in_the_middle_of_a_response():
    # gamma 0.9, lambda 0.5 -> gamma * lambda = 0.45. Row 0 as the counted sequence (r, V): (0, .2) (0, .4) (1, .5)
    #   t5: delta = 1 - 0.5 = 0.5                    A = 0.5
    #   t3: delta = 0 + 0.9 * 0.5 - 0.4 = 0.05        A = 0.05 + 0.45 * 0.5 = 0.275
    #   t0: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16        A = 0.16 + 0.45 * 0.275 = 0.28375
    # Row 1 counted (0, 1) (2, 2): t2: delta = 2 - 2 = 0, A = 0; t1: delta = 0.9 * 2 - 1 = 0.8, A = 0.8
    adv = gae(G_REWARDS, G_VALUES, G_MASK, gamma=0.9, lambd=0.5)
    close(adv, [[0.28375, 0, 0, 0.275, 0, 0.5], [0, 0.8, 0, 0, 0, 0]])
    # the same as cutting the tool tokens out of the rows
    cut = gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.5]]), torch.ones(1, 3), 0.9, 0.5)
    close(cut, [[0.28375, 0.275, 0.5]])


def test_ppo_estimator_over_tool_tokens_with_kl_rewards():
    # ppo puts the scalar reward on the last counted token and -kl_coef * (old - ref) on counted tokens only.
    # old - ref = 1 on every token of row 0 -> token rewards -0.1 on t0, t3 and (-0.1 + 1) on t5; tool tokens 0.
    #   t5: delta = 0.9 - 0.5 = 0.4                   A = 0.4
    #   t3: delta = -0.1 + 0.45 - 0.4 = -0.05          A = -0.05 + 0.45 * 0.4 = 0.13
    #   t0: delta = -0.1 + 0.36 - 0.2 = 0.06           A = 0.06 + 0.45 * 0.13 = 0.1185
    # returns = (A + V) on counted tokens: 0.3185, 0.53, 0.9
    old = torch.full((1, 6), -1.0)
    ref = torch.full((1, 6), -2.0)
    cfg = params(gamma=0.9, lambd=0.5, kl_coef=0.1)
    out = ppo(AdvantageInputs(torch.tensor([1.0]), G_MASK[:1], 1, cfg, old, ref, G_VALUES[:1]))
    close(out.advantages, [[0.1185, 0, 0, 0.13, 0, 0.4]])
    close(out.returns, [[0.3185, 0, 0, 0.53, 0, 0.9]])


# Value-loss example, clip c = 0.5. Per token (v, v_old, R) -> v_clipped = v_old + clamp(v - v_old, -c, c):
#   t0 (1, 0.75, 2):  v_cl = 1.0   (1-2)^2 = 1,    (1-2)^2 = 1      -> 0.5 * 1    = 0.5,   not clipped, dl/dv = v-R = -1
#   t1 (2, 1, 3):     v_cl = 1.5   (2-3)^2 = 1,    (1.5-3)^2 = 2.25 -> 0.5 * 2.25 = 1.125, clipped,     dl/dv = 0
#   t2 (0, 1, -1):    v_cl = 0.5   (0+1)^2 = 1,    (0.5+1)^2 = 2.25 -> 1.125,              clipped,     dl/dv = 0
#   t3 (2, 1, 1):     v_cl = 1.5   (2-1)^2 = 1,    (1.5-1)^2 = 0.25 -> 0.5,                not clipped, dl/dv = 1
#   t5 (0.5, 0.5, 0): v_cl = 0.5   0.25,           0.25             -> 0.125,              not clipped, dl/dv = 0.5
#   t4 (100, 0, 0) is masked out.
# Rows: row0 = [t0, t1, t4] mask [1, 1, 0]; row1 = [t2, t3, t5] mask [1, 1, 1].
V = torch.tensor([[1.0, 2.0, 100.0], [0.0, 2.0, 0.5]])
V_OLD = torch.tensor([[0.75, 1.0, 0.0], [1.0, 1.0, 0.5]])
RET = torch.tensor([[2.0, 3.0, 0.0], [-1.0, 1.0, 0.0]])
VMASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_clipped_value_loss_and_gradient_sample_mode():
    v = V.clone().requires_grad_(True)
    loss, m = value_loss(v, V_OLD, RET, VMASK, clip=0.5, per_token=False)
    # row means: (0.5 + 1.125) / 2 = 0.8125 and (1.125 + 0.5 + 0.125) / 3 = 7/12 -> (0.8125 + 7/12) / 2 = 67/96
    assert float(loss.detach()) == pytest.approx(67 / 96)
    # clipfrac (1/2 + 1/3) / 2 = 5/12; values_mean (1.5 + 2.5/3) / 2 = 7/6; returns_mean (2.5 + 0) / 2 = 1.25
    assert m == pytest.approx({"value_loss": 67 / 96, "vf_clipfrac": 5 / 12, "values_mean": 7 / 6,
                               "returns_mean": 1.25})
    # d loss / d v_t = 0.5 * d(sq)/dv / (row tokens * B) = (v - R) / (n_row * 2) on unclipped tokens, 0 elsewhere
    (g,) = torch.autograd.grad(loss, v)
    close(g, [[-1 / 4, 0.0, 0.0], [0.0, 1 / 6, 0.5 / 6]])


def test_clipped_value_loss_and_gradient_token_mode():
    v = V.clone().requires_grad_(True)
    loss, m = value_loss(v, V_OLD, RET, VMASK, clip=0.5, per_token=True)
    # (0.5 + 1.125 + 1.125 + 0.5 + 0.125) / 5 = 0.675; clipfrac 2/5; values (1+2+0+2+0.5)/5; returns (2+3-1+1+0)/5
    assert m == pytest.approx({"value_loss": 0.675, "vf_clipfrac": 0.4, "values_mean": 1.1, "returns_mean": 1.0})
    (g,) = torch.autograd.grad(loss, v)
    close(g, [[-1 / 5, 0.0, 0.0], [0.0, 1 / 5, 0.5 / 5]])


def test_value_loss_without_clip_and_micro_batches():
    v = V.clone().requires_grad_(True)
    loss, m = value_loss(v, V_OLD, RET, VMASK, clip=None, per_token=False)
    # 0.5 * (v - R)^2: row0 (0.5, 0.5) -> 0.5; row1 (0.5, 0.5, 0.125) -> 0.375; mean 0.4375; nothing clipped
    assert float(loss.detach()) == pytest.approx(0.4375) and m["vf_clipfrac"] == 0.0
    (g,) = torch.autograd.grad(loss, v)
    close(g, [[-1 / 4, -1 / 4, 0.0], [1 / 6, 1 / 6, 0.5 / 6]])
    # old_values=None: the clip cannot bind (v_old = v), so the clipped loss equals the unclipped one
    loss_none, m_none = value_loss(V, None, RET, VMASK, clip=0.5, per_token=False)
    assert float(loss_none) == pytest.approx(0.4375) and m_none["vf_clipfrac"] == 0.0
    # with the global normalisers the micro-batch losses and metrics sum to the batch's
    for per_token, kw in ((False, {"num_samples": 2}), (True, {"num_tokens": 5})):
        full, fm = value_loss(V, V_OLD, RET, VMASK, 0.5, per_token)
        parts = [value_loss(V[i:i + 1], V_OLD[i:i + 1], RET[i:i + 1], VMASK[i:i + 1], 0.5, per_token, **kw)
                 for i in (0, 1)]
        assert float(parts[0][0] + parts[1][0]) == pytest.approx(float(full))
        for k in fm:
            assert parts[0][1][k] + parts[1][1][k] == pytest.approx(fm[k]), k


def test_value_loss_errors():
    with pytest.raises(ValueError, match=r"values \(2, 3\), returns \(2, 2\)"):
        value_loss(V, V_OLD, RET[:, :2], VMASK, 0.5, False)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(V, V_OLD[:1], RET, VMASK, 0.5, False)
    with pytest.raises(ValueError, match="clip must be > 0"):
        value_loss(V, V_OLD, RET, VMASK, 0.0, False)


def test_explained_variance_by_hand():
    # masked returns (1, 2, 3, 4): mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
    # The 50s and -50s sit on masked-out tokens.
    R = torch.tensor([[1.0, 2.0, 50.0], [3.0, 50.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    # V = (1, 2, 2, 5): R - V = (0, 0, 1, -1), variance 0.5 -> EV = 1 - 0.5 / 1.25 = 0.6
    assert explained_variance(torch.tensor([[1.0, 2.0, -50.0], [2.0, -50.0, 5.0]]), R, mask) == pytest.approx(0.6)
    assert explained_variance(R.clone(), R, mask) == 1.0                         # perfect values
    assert explained_variance(torch.full_like(R, 7.0), R, mask) == pytest.approx(0.0)  # a constant explains nothing
    assert explained_variance(-R, R, mask) == pytest.approx(-3.0)                # R - V = 2R: 1 - 4 * 1.25 / 1.25
    # degenerate: returns that do not vary (all samples got the same return) or no masked token -> 0.0, not NaN
    same = torch.full((2, 3), 0.7)
    assert explained_variance(torch.zeros(2, 3), same, mask) == 0.0
    assert explained_variance(same, same, mask) == 0.0
    assert explained_variance(R, R, torch.zeros(2, 3)) == 0.0
    with pytest.raises(ValueError, match="explained_variance"):
        explained_variance(R[:, :2], R, mask)

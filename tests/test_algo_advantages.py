"""Advantage estimators checked against numbers computed by hand (see the comments)."""
import math

import pytest
import torch

from tests.algo_params import params
from slick.algo import (
    ESTIMATORS,
    AdvantageInputs,
    get_estimator,
    grpo,
    gspo,
    masked_mean,
    masked_whiten,
    normalize_advantages,
    ppo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)

EPS = 1e-6  # GRPO's std epsilon


def run(estimator, rewards, mask, **kw):
    """Call an estimator with AdvantageInputs; return (advantages, returns)."""
    kw.setdefault("cfg", params())   # the typed algorithm settings of a default Config
    out = estimator(AdvantageInputs(rewards, mask, **kw))
    return out.advantages, out.returns


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=tol)


# Two groups of 4: [1, 0, 0, 0] and [2, 2, 2, 2]; padding zeros in the masks.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
MASK = torch.tensor(
    [[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.float32
)


def test_grpo_hand_values():
    # group 1: mean 0.25, deviations (0.75, -0.25, -0.25, -0.25),
    # unbiased var = (0.5625 + 3 * 0.0625) / 3 = 0.25 -> std 0.5
    # adv = dev / (0.5 + 1e-6); group 2 (all equal) -> 0 everywhere.
    adv, ret = run(grpo, REWARDS, MASK, group_size=4)
    s = 0.5 + EPS
    a, b = 0.75 / s, -0.25 / s
    expected = [[a, a, 0], [b, 0, 0], [b, b, b], [0, b, b]] + [[0, 0, 0]] * 4
    close(adv, expected)
    close(ret, expected)
    assert not torch.isnan(adv).any()


def test_gspo_equals_grpo():
    adv_g, _ = run(grpo, REWARDS, MASK, group_size=4)
    adv_s, _ = run(gspo, REWARDS, MASK, group_size=4)
    close(adv_s, adv_g.tolist())


def test_dr_grpo_and_raw_rewards():
    # no std division: deviations themselves; raw: the reward itself on every masked token
    cfg = params(disable_grpo_std_normalization=True)
    adv, _ = run(grpo, REWARDS, MASK, group_size=4, cfg=cfg)
    expected = [[0.75, 0.75, 0], [-0.25, 0, 0], [-0.25] * 3, [0, -0.25, -0.25]] + [[0, 0, 0]] * 4
    close(adv, expected)
    cfg = params(disable_rewards_normalization=True)
    adv, _ = run(grpo, REWARDS, MASK, group_size=4, cfg=cfg)
    close(adv, (REWARDS[:, None] * MASK).tolist())


def test_group_of_one_is_zero_not_nan():
    r = torch.tensor([3.0, -1.0])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    for fn in (grpo, gspo, rloo):
        adv, _ = run(fn, r, m, group_size=1)
        close(adv, [[0, 0], [0, 0]])
    adv, _ = run(grpo, r, m, group_size=1, cfg=params(disable_grpo_std_normalization=True))
    close(adv, [[0, 0], [0, 0]])


def test_rloo_hand_values():
    # group [1, 0, 0, 0]: 1 - 0 = 1; 0 - (1 + 0 + 0) / 3 = -1/3 ; group all 2 -> 0
    adv, ret = run(rloo, REWARDS, MASK, group_size=4)
    c = -1.0 / 3.0
    expected = [[1, 1, 0], [c, 0, 0], [c, c, c], [0, c, c]] + [[0, 0, 0]] * 4
    close(adv, expected)
    close(ret, expected)
    # group [3, 1]: 3 - 1 = 2, 1 - 3 = -2
    adv, _ = run(rloo, torch.tensor([3.0, 1.0]), torch.ones(2, 1), group_size=2)
    close(adv, [[2.0], [-2.0]])


# REINFORCE++ example: row 1 has a skipped (tool) token in the middle.
RP_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
RP_OLD = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, -1.5]])
RP_REF = torch.tensor([[-1.5, -1.0, -3.0], [-0.5, -2.0, -0.5]])
RP_CFG = params(kl_coef=0.1, gamma=0.5)


def _whiten_list(vals):
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / len(vals)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in vals]


def test_reinforce_plus_plus_hand_values():
    # old - ref = [[0.5, -1, 0], [0, 1, -1]]; kl reward = -0.1 * that on masked tokens:
    #   [[-0.05, 0.1, 0], [0, (masked), 0.1]]; scalar reward on last masked token (1 at t=1, 2 at t=2)
    #   token rewards [[-0.05, 1.1, 0], [0, 0, 2.1]]
    # returns, gamma 0.5, over masked tokens: row0 t1 = 1.1, t0 = -0.05 + 0.5*1.1 = 0.5
    #   row1 t2 = 2.1, t1 skipped, t0 = 0 + 0.5*2.1 = 1.05
    # whitened over (0.5, 1.1, 1.05, 2.1): mean 1.1875, var (pop.) 0.33296875
    adv, ret = run(
        reinforce_plus_plus, torch.tensor([1.0, 2.0]), RP_MASK, group_size=1, cfg=RP_CFG, old_logprobs=RP_OLD, ref_logprobs=RP_REF
    )
    close(ret, [[0.5, 1.1, 0.0], [1.05, 0.0, 2.1]])
    sd = math.sqrt(0.33296875 + 1e-8)
    close(adv, [[-0.6875 / sd, -0.0875 / sd, 0.0], [-0.1375 / sd, 0.0, 0.9125 / sd]])
    assert abs(float(masked_mean(adv, RP_MASK))) < 1e-6
    w = _whiten_list([0.5, 1.1, 1.05, 2.1])  # the same whitening in plain Python
    close(adv, [[w[0], w[1], 0.0], [w[2], 0.0, w[3]]])


def test_reinforce_plus_plus_baseline_hand_values():
    # group of 2 with rewards (1, 2): mean 1.5 -> centered (-0.5, 0.5)
    # token rewards [[-0.05, 0.1 - 0.5, 0], [0, 0, 0.1 + 0.5]] = [[-0.05, -0.4, 0], [0, 0, 0.6]]
    # returns: row0 t1 = -0.4, t0 = -0.05 + 0.5*(-0.4) = -0.25; row1 t2 = 0.6, t0 = 0.3
    # whitened over (-0.25, -0.4, 0.3, 0.6): mean 0.0625,
    #   deviations (-0.3125, -0.4625, 0.2375, 0.5375), pop. var 0.656875 / 4 = 0.16421875
    adv, ret = run(
        reinforce_plus_plus_baseline, torch.tensor([1.0, 2.0]), RP_MASK, group_size=2, cfg=RP_CFG, old_logprobs=RP_OLD, ref_logprobs=RP_REF
    )
    close(ret, [[-0.25, -0.4, 0.0], [0.3, 0.0, 0.6]])
    sd = math.sqrt(0.16421875 + 1e-8)
    close(adv, [[-0.3125 / sd, -0.4625 / sd, 0.0], [0.2375 / sd, 0.0, 0.5375 / sd]])


def test_reinforce_without_kl_and_missing_logprobs():
    # kl_coef 0: gamma 1 -> returns are the reward on every masked token; all equal -> whitened 0
    adv, ret = run(reinforce_plus_plus, torch.tensor([1.0, 1.0]), RP_MASK, group_size=1)
    close(ret, [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    close(adv, [[0.0] * 3, [0.0] * 3])
    with pytest.raises(ValueError, match="old_logprobs and ref_logprobs"):
        run(reinforce_plus_plus, torch.tensor([1.0, 1.0]), RP_MASK, group_size=1, cfg=RP_CFG)


def test_ppo_gae_hand_values():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 1.0, 2.0], [1.0, 9.0, 0.5]])  # 9.0 sits on a masked-out token
    cfg = params(gamma=0.5, lambd=0.5, kl_coef=0.0)
    # row0 rewards [0, 0, 1]: t2 delta = 1 - 2 = -1, A2 = -1
    #   t1 delta = 0 + 0.5*2 - 1 = 0, A1 = 0 + 0.25*(-1) = -0.25
    #   t0 delta = 0 + 0.5*1 - 0.5 = 0, A0 = 0.25*(-0.25) = -0.0625
    # row1 rewards [0, -, 2]: t2 delta = 2 - 0.5 = 1.5; t0 delta = 0.5*0.5 - 1 = -0.75,
    #   A0 = -0.75 + 0.25*1.5 = -0.375
    adv, ret = run(ppo, torch.tensor([1.0, 2.0]), mask, group_size=1, cfg=cfg, values=values)
    close(adv, [[-0.0625, -0.25, -1.0], [-0.375, 0.0, 1.5]])
    close(ret, [[0.4375, 0.75, 1.0], [0.625, 0.0, 2.0]])


def test_ppo_with_kl_rewards():
    mask = torch.ones(1, 3)
    values = torch.tensor([[0.5, 1.0, 2.0]])
    old = torch.tensor([[-1.0, -1.0, -2.0]])
    ref = torch.tensor([[-2.0, -1.0, -1.0]])  # old - ref = (1, 0, -1)
    cfg = params(gamma=0.5, lambd=0.5, kl_coef=0.1)
    # token rewards (-0.1, 0, 0.1 + 1): t2 delta = 1.1 - 2 = -0.9
    #   t1 delta = 0 + 1 - 1 = 0, A1 = 0.25 * -0.9 = -0.225
    #   t0 delta = -0.1 + 0.5 - 0.5 = -0.1, A0 = -0.1 + 0.25 * -0.225 = -0.15625
    adv, _ = run(ppo, torch.tensor([1.0]), mask, group_size=1, cfg=cfg, values=values, old_logprobs=old, ref_logprobs=ref)
    close(adv, [[-0.15625, -0.225, -0.9]])


def test_ppo_needs_values():
    with pytest.raises(ValueError, match="needs values"):
        run(ppo, torch.tensor([1.0]), torch.ones(1, 2), group_size=1)


def test_normalize_advantages_and_whiten():
    x = torch.tensor([[1.0, 2.0, 50.0], [3.0, -7.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # masked (1, 2, 3): mean 2, pop. var 2/3
    s = math.sqrt(2.0 / 3.0 + 1e-8)
    close(normalize_advantages(x, m), [[-1 / s, 0.0, 0.0], [1 / s, 0.0, 0.0]])
    close(masked_whiten(x, m, shift_mean=False), [[-1 / s + 2, 2.0, 0.0], [1 / s + 2, 0.0, 0.0]])
    assert float(masked_mean(x, torch.zeros_like(m))) == 0.0


def test_registry_and_errors():
    assert set(ESTIMATORS) == {"grpo", "gspo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"}
    assert get_estimator("rloo") is rloo
    with pytest.raises(ValueError, match="unknown advantage estimator 'foo'.*grpo.*rloo"):
        get_estimator("foo")
    with pytest.raises(ValueError, match="group_size=3"):
        run(grpo, torch.ones(4), torch.ones(4, 2), group_size=3)
    with pytest.raises(ValueError, match="mask must be"):
        run(grpo, torch.ones(4), torch.ones(3, 2), group_size=2)

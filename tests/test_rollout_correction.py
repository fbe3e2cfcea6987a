"""Rollout correction (TIS/MIS at token, sequence and geometric level), the logprob-gap metrics and the coarse
full-vocabulary KL, against hand-computed values."""
import dataclasses
import math

import pytest
import torch

from slick.algo import LossInputs, compute_policy_objective
from slick.algo.correction import coarse_kl, gap_stats, log_ratios, masked_weights, truncated_weights
from tests.algo_params import params

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.3, 0.0]])
ROLL = torch.tensor([[-1.5, -1.0, -0.5], [-0.3, -0.1, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def test_log_ratios_per_level():
    # d = old - rollout, masked: [[0.5, -1.0, 0.0], [0.0, -0.2, 0]]
    tok = log_ratios(OLD, ROLL, MASK, "token")
    assert torch.allclose(tok, torch.tensor([[0.5, -1.0, 0.0], [0.0, -0.2, 0.0]]))
    seq = log_ratios(OLD, ROLL, MASK, "sequence")       # sums -0.5 and -0.2, only on masked-in tokens
    assert torch.allclose(seq, torch.tensor([[-0.5, -0.5, -0.5], [-0.2, -0.2, 0.0]]))
    geo = log_ratios(OLD, ROLL, MASK, "geometric")      # means -0.5/3 and -0.2/2
    assert torch.allclose(geo, torch.tensor([[-0.5 / 3] * 3, [-0.1, -0.1, 0.0]]))
    with pytest.raises(ValueError, match="unknown rollout-correction level"):
        log_ratios(OLD, ROLL, MASK, "word")


def test_truncated_and_masked_weights():
    lr = torch.tensor([[math.log(3.0), math.log(0.25), 0.0]])
    w, raw, changed = truncated_weights(lr, 0.5, 2.0)
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0]])) and torch.allclose(raw, torch.tensor([[3.0, 0.25, 1.0]]))
    assert changed.tolist() == [[1.0, 1.0, 0.0]]
    keep, _, dropped = masked_weights(lr, 0.5, 2.0)
    assert keep.tolist() == [[0.0, 0.0, 1.0]] and dropped.tolist() == [[1.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="above its upper bound"):
        masked_weights(lr, 3.0, 2.0)


def test_sequence_mis_drops_a_whole_sequence_from_the_loss():
    base = dict(advantage_estimator="grpo", use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1", kl_coef=0.0,
                eps_clip=0.2, eps_clip_high=None, eps_clip_c=None, entropy_coef=0.0,
                disable_grpo_std_normalization=False, disable_rewards_normalization=False,
                calculate_per_token_loss=True, use_tis=False, tis_clip=2.0, tis_clip_low=0.0, tis_level="token",
                use_mis=True, mis_level="sequence", mis_low=0.7, mis_high=1.5, gamma=1.0, lambd=1.0)
    lp = OLD.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    inputs = LossInputs(lp, None, MASK, adv, old_logprobs=OLD, rollout_logprobs=ROLL, num_samples=2, num_tokens=5)
    loss, metrics = compute_policy_objective(dataclasses.replace(params(), **base), inputs)
    # sequence ratios exp(-0.5)=0.607 (outside [0.7, 1.5]: dropped) and exp(-0.2)=0.819 (kept): on-policy pg = -adv,
    # per-token mean over 5 tokens of the kept row's 2 tokens x -2
    assert loss.item() == pytest.approx(-4.0 / 5, abs=1e-6)
    assert metrics["mis_maskfrac"] == pytest.approx(3 / 5)
    loss.backward()
    assert lp.grad[0].abs().sum().item() == 0.0 and lp.grad[1, :2].abs().min().item() > 0


def test_gap_stats():
    g = gap_stats(OLD, ROLL, MASK, 0.3)      # |gaps| on masked-in tokens: 0.5, 1.0, 0.0, 0.0, 0.2
    assert g == pytest.approx({"abs_sum": 1.7, "n": 5.0, "abs_max": 1.0, "over": 2.0})


def test_coarse_kl_counts_the_rest_of_the_vocabulary():
    e = {1: math.log(0.5), 2: math.log(0.3)}            # rest 0.2
    t = {1: math.log(0.4), 2: math.log(0.3)}            # rest 0.3
    want = 0.5 * math.log(0.5 / 0.4) + 0.0 + 0.2 * math.log(0.2 / 0.3)
    assert coarse_kl(e, t) == pytest.approx(want, abs=1e-12)
    assert coarse_kl(e, e) == 0.0
    # never above the full KL it coarsens: a 4-token distribution, the last two merged
    pe, pt = [0.5, 0.3, 0.15, 0.05], [0.4, 0.3, 0.1, 0.2]
    full = sum(a * math.log(a / b) for a, b in zip(pe, pt))
    assert coarse_kl({0: math.log(0.5), 1: math.log(0.3)}, {0: math.log(0.4), 1: math.log(0.3)}) <= full
    with pytest.raises(ValueError, match="different tokens"):
        coarse_kl(e, {1: -1.0})

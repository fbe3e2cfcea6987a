"""Samples whose policy-loss gradient is exactly zero are left out of the forward and backward
(slick.algo.objective.zero_gradient / WholeBatchLoss, slick.loop.step.without_zero_gradients): the update is the
one over the whole batch, and the metrics other than the loss describe the samples trained on."""
import functools

import pytest
import torch

from slick.algo import AlgoParams, LossInputs, compute_policy_objective
from slick.algo.objective import WholeBatchLoss, zero_gradient
from slick.config import Config
from slick.algo.assemble import objective_from_config
from slick.loop.step import train_on_samples
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples


def params(**kw):
    return AlgoParams.from_config(Config.from_flat(kw))


def test_zero_gradient_needs_zero_advantages_and_no_other_term():
    zeros, some = torch.zeros(5), torch.tensor([0.0, 0.0, 0.5, 0.0, 0.0])
    assert zero_gradient(params(), zeros) is True
    assert zero_gradient(params(), -zeros) is True
    assert zero_gradient(params(), some) is False
    assert zero_gradient(params(entropy_coef=0.01), zeros) is False
    assert zero_gradient(params(use_kl_loss=True, kl_loss_coef=0.1), zeros) is False
    assert zero_gradient(params(use_kl_loss=True, kl_loss_coef=0.0), zeros) is True


@pytest.mark.parametrize("per_token", [False, True])
def test_whole_batch_loss_on_the_nonzero_rows_equals_the_loss_over_all_rows(per_token):
    """Rows 1 and 3 have zero advantages. The loss over rows 0 and 2 with the whole batch's normalisers has the
    same value and the same gradient as over all four; its clip fraction and KL are the two rows' own means."""
    g = torch.Generator().manual_seed(0)
    B, T = 4, 6
    mask = torch.ones(B, T)
    mask[0, 4:] = 0
    mask[2, 2:] = 0
    adv = torch.randn(B, T, generator=g) * mask
    adv[1] = adv[3] = 0.0
    old = torch.randn(B, T, generator=g) * 0.3 - 2.0
    new = (old + torch.randn(B, T, generator=g) * 0.4)
    ent = torch.rand(B, T, generator=g)
    cfg = params(calculate_per_token_loss=per_token, eps_clip=0.2)
    n_tok = float(mask.sum())

    full_lp = new.clone().requires_grad_(True)
    loss_full, m_full = compute_policy_objective(cfg, LossInputs(full_lp, ent, mask, adv, old_logprobs=old,
                                                                 num_samples=B, num_tokens=n_tok))
    loss_full.backward()

    rows = [0, 2]
    sub_lp = new[rows].clone().requires_grad_(True)
    sub_tokens = float(mask[rows].sum())
    whole = WholeBatchLoss(functools.partial(compute_policy_objective, cfg), float(B), n_tok)
    loss_sub, m_sub = whole(LossInputs(sub_lp, ent[rows], mask[rows], adv[rows], old_logprobs=old[rows],
                                       num_samples=2, num_tokens=sub_tokens))
    loss_sub.backward()
    _, m_own = compute_policy_objective(cfg, LossInputs(new[rows], ent[rows], mask[rows], adv[rows],
                                                        old_logprobs=old[rows], num_samples=2, num_tokens=sub_tokens))

    assert float(loss_sub.detach()) == pytest.approx(float(loss_full.detach()), rel=1e-6)
    assert m_sub["pg_loss"] == pytest.approx(m_full["pg_loss"], rel=1e-6)
    torch.testing.assert_close(sub_lp.grad, full_lp.grad[rows], rtol=1e-6, atol=1e-8)
    assert torch.all(full_lp.grad[[1, 3]] == 0)
    for key in ("pg_clipfrac", "ppo_kl", "entropy_loss"):
        assert m_sub[key] == pytest.approx(m_own[key], rel=1e-6), key
    assert m_own["pg_clipfrac"] != pytest.approx(m_full["pg_clipfrac"])   # the two kinds of mean do differ here
    # the entropy mean of rows 0 and 2 by hand
    if per_token:
        want = float((ent[rows] * mask[rows]).sum() / mask[rows].sum())
    else:
        want = float(((ent[rows] * mask[rows]).sum(1) / mask[rows].sum(1)).mean())
    assert m_sub["entropy_loss"] == pytest.approx(want, rel=1e-6)


def _trained(tiny_model_dir, rewards_per_step, **kw):
    """Weights and metrics after one step per rewards list, on the same 4 samples (2 prompts x 2 samples)."""
    cfg = make_cfg(tiny_model_dir, advantage_estimator="grpo", rollout_batch_size=2, n_samples_per_prompt=2,
                   weight_decay=0.1, **kw)
    torch.manual_seed(0)
    tr = Trainer(cfg)
    samples = make_samples(4, seed=3)
    metrics = []
    for step, rewards in enumerate(rewards_per_step):
        m, _ = train_on_samples(cfg, tr, samples, rewards, objective_from_config(cfg), step=step)
        metrics.append(m)
    return {n: p.detach().clone() for n, p in tr.model.named_parameters()}, metrics


def test_training_without_the_zero_gradient_samples_gives_the_whole_batch_update(tiny_model_dir):
    """Step 0: the first prompt's two samples got the same reward (advantages 0), so 2 of 4 samples train.
    Step 1: every reward equal: no sample is computed, and AdamW still steps on the exact zero gradient (its
    moments carry step 0's update on), exactly as over the whole batch; not stepping would leave the weights
    unchanged."""
    steps = [[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    w_all, m_all = _trained(tiny_model_dir, steps, train_zero_advantage_samples=True)
    w_skip, m_skip = _trained(tiny_model_dir, steps)
    assert [m["train/trained_samples"] for m in m_all] == [4.0, 4.0]
    assert [m["train/trained_samples"] for m in m_skip] == [2.0, 0.0]
    assert m_skip[1]["train/tokens"] == 0.0                     # no sample computed
    # AdamW divides by the gradient's scale, so rounding in near-zero gradient entries moves weights by up to
    # ~0.5% of one step (lr 1e-3); the gradient norm, which a wrong normaliser would scale, is compared tightly
    for n in w_all:
        torch.testing.assert_close(w_skip[n], w_all[n], rtol=0, atol=2e-5, msg=n)
    w_one, _ = _trained(tiny_model_dir, steps[:1])
    assert max(float((w_all[n] - w_one[n]).abs().max()) for n in w_all) > 1e-5   # step 1 did move the weights
    for a, b in zip(m_all, m_skip):
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5, abs=1e-7)
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-5, abs=1e-9)


def test_a_custom_loss_trains_on_every_sample(tiny_model_dir):
    """A loss other than the built-in objective may read more than the advantages: nothing is left out."""
    cfg = make_cfg(tiny_model_dir, advantage_estimator="grpo", rollout_batch_size=2, n_samples_per_prompt=2)
    tr = Trainer(cfg)

    def custom(p, inputs):
        return compute_policy_objective(p, inputs)

    loss_fn = functools.partial(custom, AlgoParams.from_config(cfg))
    m, _ = train_on_samples(cfg, tr, make_samples(4, seed=3), [1.0, 1.0, 0.0, 1.0], loss_fn, step=0)
    assert m["train/trained_samples"] == 4.0

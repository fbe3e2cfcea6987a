"""KL, clipped policy loss, GSPO, TIS, reductions and the full objective, checked by hand."""
import math

import pytest
import torch

from tests.algo_params import params
from slick.algo import LossInputs, compute_policy_objective, kl, policy_loss, reduce, tis_weights

E = math.exp


def obj(cfg, logprobs, entropy, mask, advantages, **kw):
    """compute_policy_objective with the inputs as one LossInputs."""
    return compute_policy_objective(cfg, LossInputs(logprobs, entropy, mask, advantages, **kw))


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, torch.as_tensor(b, dtype=a.dtype), atol=tol, rtol=tol)


def test_kl_types_by_hand():
    logp = torch.tensor([-1.0, -2.0, -0.5, -20.0])
    ref = torch.tensor([-1.5, -1.0, -0.5, -5.0])
    # d = logp - ref = (0.5, -1, 0, -15)
    close(kl(logp, ref, "k1"), [0.5, -1.0, 0.0, -15.0])
    close(kl(logp, ref, "k2"), [0.125, 0.5, 0.0, 112.5])
    # k3 = exp(-d) - 1 + d
    k3 = [E(-0.5) - 0.5, E(1.0) - 2.0, 0.0, E(15.0) - 16.0]  # 0.10653, 0.71828, 0, 3269001.37
    close(kl(logp, ref, "k3"), k3)
    close(kl(logp, ref, "low_var_kl"), [k3[0], k3[1], 0.0, 10.0])  # clamped at 10
    with pytest.raises(ValueError, match="unknown KL type 'k4'"):
        kl(logp, ref, "k4")


# Token-level PPO example, one row of 7 tokens; the last is padding (mask 0).
# log-ratios (new - old) and advantages per token:
LR = [0.1, 0.5, -0.5, 1.5, 0.5, -0.5, 3.0]
ADV = [1.0, 1.0, -1.0, -1.0, -1.0, 1.0, 5.0]
MASK = [1, 1, 1, 1, 1, 1, 0]


def _ppo_inputs():
    old = torch.tensor([[-2.0] * 7])
    new = (old + torch.tensor([LR])).requires_grad_(True)
    return new, old, torch.tensor([ADV]), torch.tensor([MASK], dtype=torch.float32)


def test_ppo_clip_higher_and_dual_clip():
    new, old, adv, mask = _ppo_inputs()
    loss, m = policy_loss(new, old, adv, mask, eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0)
    # tok0 A=+1 r=e^.1 inside [0.8, 1.28]        -> -e^.1
    # tok1 A=+1 r=e^.5=1.649 > 1.28 (clip-higher)  -> -1.28 (clipped)
    # tok2 A=-1 r=e^-.5=0.607 < 0.8                -> max(0.607, 0.8) = 0.8 (clipped)
    # tok3 A=-1 r=e^1.5=4.48: max(4.48, 1.28)=4.48 > c=3 -> dual clip 3.0 (clipped)
    # tok4 A=-1 r=e^.5=1.649: max(1.649, 1.28) = 1.649 < 3 -> 1.649 (not clipped)
    # tok5 A=+1 r=e^-.5: max(-0.607, -0.8) = -0.607 (not clipped)
    expected = [-E(0.1), -1.28, 0.8, 3.0, E(0.5), -E(-0.5)]
    close(loss[0, :6], expected)
    assert m["pg_clipfrac"] == pytest.approx(3 / 6)
    assert m["ppo_kl"] == pytest.approx(-(0.1 + 0.5 - 0.5 + 1.5 + 0.5 - 0.5) / 6)
    # d loss_t / d logp_t = -A * r where unclipped, 0 where clipped
    (g,) = torch.autograd.grad((loss * mask).sum(), new)
    close(g, [[-E(0.1), 0.0, 0.0, 0.0, E(0.5), -E(-0.5), 0.0]])


def test_ppo_symmetric_clip_without_dual():
    new, old, adv, mask = _ppo_inputs()
    loss, m = policy_loss(new, old, adv, mask, eps_clip=0.2)
    # upper bound now 1.2; tok3 keeps -A*r = e^1.5 (no dual clip)
    close(loss[0, :6], [-E(0.1), -1.2, 0.8, E(1.5), E(0.5), -E(-0.5)])
    assert m["pg_clipfrac"] == pytest.approx(2 / 6)
    with pytest.raises(ValueError, match="eps_clip_c"):
        policy_loss(new, old, adv, mask, eps_clip=0.2, eps_clip_c=0.5)


def _gspo_inputs():
    # row0: 3 tokens + padding, new-old = (0.1, 0.2, 0.3) -> mean 0.2, s0 = e^0.2 = 1.2214, A = +1
    # row1: 2 tokens, new-old = (0.4, 0.6) -> mean 0.5, s1 = e^0.5 = 1.6487 > 1.28, A = +2 -> clipped
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]])
    lr = torch.tensor([[0.1, 0.2, 0.3, 5.0], [0.4, 0.6, 7.0, 7.0]])
    new = (old + lr).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return new, old, adv, mask


def test_gspo_sequence_ratio_and_gradient():
    new, old, adv, mask = _gspo_inputs()
    loss, m = policy_loss(new, old, adv, mask, eps_clip=0.2, eps_clip_high=0.28, sequence_level=True)
    s0 = E(0.2)
    close(loss * mask, [[-s0, -s0, -s0, 0.0], [-2.56, -2.56, 0.0, 0.0]])
    assert m["pg_clipfrac"] == pytest.approx(2 / 5)
    assert m["ppo_kl"] == pytest.approx(-(3 * 0.2 + 2 * 0.5) / 5)
    # sample-mean reduction over B=2: d/dlogp_t = -A * s0 / (3 tokens * 2 samples) on row0;
    # row1 is clipped -> 0. (A token-level ratio would give -e^0.1/6, -e^0.2/6, -e^0.3/6 instead.)
    (g,) = torch.autograd.grad(reduce(loss, mask, per_token_loss=False), new)
    close(g, [[-s0 / 6, -s0 / 6, -s0 / 6, 0.0], [0.0, 0.0, 0.0, 0.0]])
    # token mode: / 5 masked tokens
    loss, _ = policy_loss(new, old, adv, mask, eps_clip=0.2, eps_clip_high=0.28, sequence_level=True)
    (g,) = torch.autograd.grad(reduce(loss, mask, per_token_loss=True), new)
    close(g, [[-s0 / 5, -s0 / 5, -s0 / 5, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_tis_clamp_no_grad():
    old = torch.tensor([[-1.0, -1.0, -4.0, -0.5, 0.0]], requires_grad=True)
    rollout = torch.tensor([[-1.0, -2.0, -1.0, -1.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    # old - rollout = (0, 1, -3, 0.5, [9 masked]) -> exp = (1, 2.718, 0.0498, 1.6487)
    w, m = tis_weights(old, rollout, mask, clip_low=0.1, clip_high=2.0)
    close(w[0, :4], [1.0, 2.0, 0.1, E(0.5)])
    assert not w.requires_grad
    assert m["tis_mean"] == pytest.approx((1 + E(1) + E(-3) + E(0.5)) / 4, rel=1e-5)
    assert m["tis_clipfrac"] == pytest.approx(2 / 4)


def test_reduce_modes_and_microbatches():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # sample mode: per-sample means 1.5, 4, 0 (empty row) -> 5.5 / 3
    assert float(reduce(x, mask, per_token_loss=False)) == pytest.approx(5.5 / 3)
    # token mode: (1 + 2 + 4) / 3
    assert float(reduce(x, mask, per_token_loss=True)) == pytest.approx(7 / 3)
    # micro-batches of rows {0} and {1, 2} with the global normalisers sum to the global value
    parts_s = float(reduce(x[:1], mask[:1], False, num_samples=3)) + float(reduce(x[1:], mask[1:], False, num_samples=3))
    parts_t = float(reduce(x[:1], mask[:1], True, num_tokens=3)) + float(reduce(x[1:], mask[1:], True, num_tokens=3))
    assert parts_s == pytest.approx(5.5 / 3)
    assert parts_t == pytest.approx(7 / 3)


def _onpolicy():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]], requires_grad=True)
    adv = torch.tensor([[1.5, 1.5, 0.0], [-0.5, -0.5, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, adv, mask


def test_onpolicy_gradient_is_minus_advantage_over_normaliser():
    logp, adv, mask = _onpolicy()
    cfg = params(eps_clip=0.2)
    loss, m = obj(cfg, logp, None, mask, adv)
    # ratio 1: per-sample means -1.5 and +0.5 -> loss = (-1.5 + 0.5) / 2 = -0.5
    assert float(loss.detach()) == pytest.approx(-0.5)
    assert m["pg_clipfrac"] == 0.0 and m["ppo_kl"] == 0.0
    (g,) = torch.autograd.grad(loss, logp)
    # sample mode: -A / (n_tokens_of_sample * B): row0 -1.5/4, row1 0.5/6
    close(g, [[-0.375, -0.375, 0.0], [0.5 / 6, 0.5 / 6, 0.5 / 6]])

    cfg = params(eps_clip=0.2, calculate_per_token_loss=True)
    loss, _ = obj(cfg, logp, None, mask, adv)
    assert float(loss.detach()) == pytest.approx((-3.0 + 1.5) / 5)
    (g,) = torch.autograd.grad(loss, logp)
    close(g, [[-0.3, -0.3, 0.0], [0.1, 0.1, 0.1]])


def test_objective_microbatch_sum_matches_global():
    logp, adv, mask = _onpolicy()
    for per_token in (False, True):
        cfg = params(calculate_per_token_loss=per_token)
        full, fm = obj(cfg, logp, None, mask, adv)
        kw = dict(num_samples=2, num_tokens=5)
        a, am = obj(cfg, logp[:1], None, mask[:1], adv[:1], **kw)
        b, bm = obj(cfg, logp[1:], None, mask[1:], adv[1:], **kw)
        assert float((a + b).detach()) == pytest.approx(float(full.detach()))
        assert am["pg_loss"] + bm["pg_loss"] == pytest.approx(fm["pg_loss"])


def test_objective_entropy_kl_and_metrics():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ent = torch.tensor([[0.5, 1.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.5]])
    mask = torch.ones(1, 2)
    adv = torch.ones(1, 2)
    cfg = params(entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k1")
    loss, m = obj(cfg, logp, ent, mask, adv, ref_logprobs=ref)
    # pg = -1; entropy mean 1.0; k1 = (0.5, 0.5) mean 0.5 -> loss = -1 - 0.01*1 + 0.5*0.5 = -0.76
    assert float(loss.detach()) == pytest.approx(-0.76)
    assert m == pytest.approx(
        {"loss": -0.76, "pg_loss": -1.0, "pg_clipfrac": 0.0, "ppo_kl": 0.0, "kl_loss": 0.5, "entropy_loss": 1.0}
    )
    gl, ge = torch.autograd.grad(loss, (logp, ent))
    # d/dlogp: pg -1/2, kl 0.5 * 1/2 -> -0.25 each; d/dentropy: -0.01/2
    close(gl, [[-0.25, -0.25]])
    close(ge, [[-0.005, -0.005]])


def test_objective_tis_and_gspo():
    new, old, adv, mask = _gspo_inputs()
    rollout = old - torch.tensor([[0.0, 1.0, -3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # old - rollout as in TIS test
    cfg = params(advantage_estimator="gspo", eps_clip=0.2, eps_clip_high=0.28, use_tis=True, tis_clip=2.0,
                          tis_clip_low=0.1)
    loss, m = obj(cfg, new, None, mask, adv, old_logprobs=old, rollout_logprobs=rollout)
    s0 = E(0.2)
    # row0 per-token loss -s0 * w with w = (1, 2, 0.1); row1 -2.56 * 1 per token
    # sample mode: ((-s0 * 3.1) / 3 + (-2.56)) / 2
    assert float(loss.detach()) == pytest.approx((-s0 * 3.1 / 3 - 2.56) / 2, rel=1e-5)
    assert set(m) == {"loss", "pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss", "entropy_loss", "tis_mean", "tis_clipfrac"}
    # tis_clipfrac per sample: row0 2/3 clamped, row1 0 -> mean 1/3
    assert m["tis_clipfrac"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="rollout_logprobs"):
        obj(cfg, new, None, mask, adv, old_logprobs=old)
    with pytest.raises(ValueError, match="entropy"):
        obj(params(entropy_coef=0.1), new, None, mask, adv)


def test_bf16_inputs_get_fp32_loss_and_gradients():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16, requires_grad=True)
    loss, _ = obj(params(), logp, None, torch.ones(1, 2), torch.tensor([[2.0, -4.0]]))
    assert loss.dtype == torch.float32
    (g,) = torch.autograd.grad(loss, logp)
    # on-policy, one sample of 2 tokens: -A / 2
    assert g.dtype == torch.bfloat16 and g.float().tolist() == [[-1.0, 2.0]]

"""Every --policy-loss equals its reference implementation in value and gradient: verl 0.9.1's
``verl.trainer.ppo.core_algos`` (installed from PyPI by ``make setup`` into .venv/verl-ref, without its dependencies;
the Makefile's REF_STAMP) on random batches, in both reductions, with masks and clip edges; plus one case each whose
numbers are derived by hand in the comments. The high-entropy token mask equals TRL's ``get_high_entropy_mask``.

Reductions: slick's token mode (--calculate-per-token-loss) is verl's ``token-mean``; slick's sample mode is verl's
``seq-mean-token-mean`` (every random row has at least one loss token, so the two sequence counts agree). SAPO and
GMPO are per-sequence means in verl whatever the mode (slick refuses them with token mode at start-up).
"""
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from slick.algo import LossInputs, compute_policy_objective
from tests.algo_params import params

REF = Path(__file__).resolve().parents[1] / ".venv" / "verl-ref"
if not (REF / "verl").is_dir():
    raise RuntimeError(f"verl's reference losses are not installed in {REF}: run `make setup`")
if str(REF) not in sys.path:
    sys.path.append(str(REF))   # appended: slick's own packages and the venv's win over anything in it

from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig, PolicyLossConfig  # noqa: E402

LOW, HIGH, C = 0.2, 0.28, 3.0
COV = dict(clip_cov_ratio=0.1, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.1, ppo_kl_coef=0.1)
VERL_NAME = {"gmpo": "geo_mean"}
SEQUENCE_MEAN = ("sapo", "gmpo")


def _verl_config(name):
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=LOW,
                       clip_ratio_low=LOW, clip_ratio_high=HIGH, clip_ratio_c=C, tau_pos=1.0, tau_neg=1.05,
                       policy_loss=PolicyLossConfig(loss_mode=VERL_NAME.get(name, name), **COV))


def _batch(seed, token_adv):
    """Logprobs near the old ones (ratios on both sides of the clip range), a few tokens exactly on-policy, one
    exactly on each clip edge; masks with zeros, every row at least one token; outcome or token advantages."""
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 9
    old = -torch.rand(B, T, generator=g) * 3.0
    d = torch.randn(B, T, generator=g) * 0.3
    d[0, :2] = 0.0
    d[1, 0], d[1, 1] = math.log(1 + HIGH), math.log(1 - LOW)
    mask = (torch.rand(B, T, generator=g) > 0.25).float()
    mask[:, 0] = 1.0
    adv = torch.randn(B, T if token_adv else 1, generator=g).expand(B, T).clone() * 2.0
    return old + d, old, adv, mask


def _slick(name, lp, old, adv, mask, per_token, seed):
    x = lp.clone().requires_grad_(True)
    extra = {"eps_clip_c": C} if name in ("vanilla",) else {}
    p = params(policy_loss=name, eps_clip=LOW, eps_clip_high=HIGH, calculate_per_token_loss=per_token, **COV, **extra)
    torch.manual_seed(seed)   # clip_cov draws its tokens with the default generator, as verl does
    loss, _ = compute_policy_objective(p, LossInputs(x, None, mask, adv, old_logprobs=old))
    loss.backward()
    return loss.detach(), x.grad


def _verl(name, lp, old, adv, mask, per_token, seed):
    x = lp.clone().requires_grad_(True)
    fn = core_algos.get_policy_loss_fn(VERL_NAME.get(name, name))
    torch.manual_seed(seed)
    loss, _ = fn(old, x, adv, mask, "token-mean" if per_token else "seq-mean-token-mean", _verl_config(name))
    loss.backward()
    return loss.detach(), x.grad


CASES = [(name, per_token) for name in ("vanilla", "gspo", "cispo", "sapo", "gpg", "gmpo", "clip_cov", "kl_cov")
         for per_token in (False, True) if not (per_token and name in SEQUENCE_MEAN)]


@pytest.mark.parametrize("name,per_token", CASES)
def test_objective_equals_verl_in_value_and_gradient(name, per_token):
    for seed in range(4):
        token_adv = seed % 2 == 1 and name not in ("gmpo",)   # GMPO is defined for sequence advantages only
        lp, old, adv, mask = _batch(seed, token_adv)
        ours, g_ours = _slick(name, lp, old, adv, mask, per_token, seed)
        ref, g_ref = _verl(name, lp, old, adv, mask, per_token, seed)
        assert ours.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6), (name, per_token, seed)
        assert torch.allclose(g_ours, g_ref, rtol=1e-5, atol=1e-7), (name, per_token, seed, g_ours - g_ref)
        assert g_ours.abs().sum() > 0


def test_the_random_batches_reach_the_branches_they_check():
    """The batches above do exercise each objective's clip: PPO clips, CISPO truncates, clip-cov cuts a token."""
    lp, old, adv, mask = _batch(0, False)
    p = params(policy_loss="clip_cov", eps_clip=LOW, eps_clip_high=HIGH, **COV)
    torch.manual_seed(0)
    _, m = compute_policy_objective(p, LossInputs(lp.clone().requires_grad_(True), None, mask, adv,
                                                  old_logprobs=old))
    assert m["pg_clipfrac"] > 0.05 and m["clip_cov_frac"] > 0
    p = params(policy_loss="cispo", eps_clip=LOW, eps_clip_high=HIGH)
    _, m = compute_policy_objective(p, LossInputs(lp.clone().requires_grad_(True), None, mask, adv,
                                                  old_logprobs=old))
    assert m["pg_clipfrac"] > 0.2
    p = params(policy_loss="kl_cov", **COV)
    _, m = compute_policy_objective(p, LossInputs(lp.clone().requires_grad_(True), None, mask, adv,
                                                  old_logprobs=old))
    assert m["kl_cov_frac"] > 0


def _run(p, lp, old, adv, mask, entropy=None):
    x = torch.tensor(lp, requires_grad=True)
    loss, m = compute_policy_objective(p, LossInputs(x, None if entropy is None else torch.tensor(entropy),
                                                     torch.tensor(mask), torch.tensor(adv),
                                                     old_logprobs=torch.tensor(old)))
    loss.backward()
    return loss.item(), x.grad, m


def test_cispo_by_hand():
    # one sequence, A = 2; token 1 ratio e^0.5 = 1.649 > 1.2: weight 1.2 (no gradient through it); token 2 ratio 1.
    # loss per token -w A lp: -1.2*2*(-1) = 2.4 and -1*2*(-2) = 4; token mean 3.2; d/dlp = -w A / 2 = -1.2, -1.0
    loss, g, m = _run(params(policy_loss="cispo", calculate_per_token_loss=True), [[-1.0, -2.0]], [[-1.5, -2.0]],
                      [[2.0, 2.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(3.2, abs=1e-6) and g.flatten().tolist() == pytest.approx([-1.2, -1.0], abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(0.5)
    # --cispo-eps-high 1.0 lifts the bound to 2: the weight is the ratio itself, e^0.5
    loss, g, _ = _run(params(policy_loss="cispo", cispo_eps_high=1.0, calculate_per_token_loss=True),
                      [[-1.0, -2.0]], [[-1.5, -2.0]], [[2.0, 2.0]], [[1.0, 1.0]])
    assert g[0, 0].item() == pytest.approx(-math.exp(0.5), abs=1e-6)


def test_sapo_by_hand():
    # on-policy (r = 1): gate = (4/tau) sigmoid(0) = 2/tau, its derivative in lp (4/tau) * tau * 1/4 = 1.
    # sample 1 A = +1 (tau 1): loss -2, grad -1; sample 2 A = -1 (tau 1.05): loss 2/1.05 = 1.904762, grad +1.
    # sample mode over 2 samples: (-2 + 1.904762) / 2 = -0.047619, grads -0.5 and +0.5
    loss, g, m = _run(params(policy_loss="sapo"), [[-1.0], [-2.0]], [[-1.0], [-2.0]], [[1.0], [-1.0]],
                      [[1.0], [1.0]])
    assert loss == pytest.approx(-0.047619, abs=1e-6) and g.flatten().tolist() == pytest.approx([-0.5, 0.5], abs=1e-6)
    assert m["sapo_gate_mean"] == pytest.approx((2 + 2 / 1.05) / 2, abs=1e-6) and m["pg_clipfrac"] == 0.0


def test_gpg_by_hand():
    # loss per token -A lp: -(1)(-1) = 1, -(-2)(-3) = -6; token mean -2.5; grad -A / 2 = -0.5, 1.0
    loss, g, _ = _run(params(policy_loss="gpg", calculate_per_token_loss=True), [[-1.0, -3.0]], [[-1.2, -2.0]],
                      [[1.0, -2.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(-2.5, abs=1e-6) and g.flatten().tolist() == pytest.approx([-0.5, 1.0], abs=1e-6)


def test_gmpo_by_hand():
    # one sequence, A = 1, d = lp - old = [0.5, -0.1], eps 0.2: min(d, clip(d)) = [0.2, -0.1], mean 0.05,
    # loss -e^0.05 = -1.051271; token 1 took the clipped (constant) branch: grad 0; token 2: -e^0.05 / 2 = -0.525636
    loss, g, m = _run(params(policy_loss="gmpo"), [[-1.0, -2.1]], [[-1.5, -2.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    assert loss == pytest.approx(-math.exp(0.05), abs=1e-6)
    assert g.flatten().tolist() == pytest.approx([0.0, -math.exp(0.05) / 2], abs=1e-6) and m["pg_clipfrac"] == 0.5


def test_clip_cov_by_hand():
    # on-policy, one sequence of 3 tokens, A = [4, 0, -1], lp = [-1, -2, -3]: mean A 1, mean lp -2,
    # cov = [3*1, -1*0, -2*-1] = [3, 0, 2]; with bounds (2.5, 4) only token 1 is a candidate, and
    # max(int(0.5 * 3), 1) = 1 token is cut. loss -A = [-4, 0, 1] -> [0, 0, 1], token mean 1/3; grads [0, 0, 1/3]
    p = params(policy_loss="clip_cov", calculate_per_token_loss=True, clip_cov_ratio=0.5, clip_cov_lb=2.5,
               clip_cov_ub=4.0)
    loss, g, m = _run(p, [[-1.0, -2.0, -3.0]], [[-1.0, -2.0, -3.0]], [[4.0, 0.0, -1.0]], [[1.0, 1.0, 1.0]])
    assert loss == pytest.approx(1 / 3, abs=1e-6) and g.flatten().tolist() == pytest.approx([0.0, 0.0, 1 / 3], abs=1e-6)
    assert m["clip_cov_frac"] == pytest.approx(1 / 3)


def test_kl_cov_by_hand():
    # same A and lp, cov [3, 0, 2]: the top max(1, int(3 * 0.34)) = 1 token is token 1, d = lp - old = 0.1 there.
    # token 1: -4 e^0.1 + 1 * |0.1| = -4.320684, token 2: 0, token 3: -(-1) * 1 = 1; token mean -1.106895.
    # grads /3: (-4 e^0.1 + 1) / 3 = -1.140228, 0, 1/3
    p = params(policy_loss="kl_cov", calculate_per_token_loss=True, kl_cov_ratio=0.34, ppo_kl_coef=1.0)
    loss, g, m = _run(p, [[-1.0, -2.0, -3.0]], [[-1.1, -2.0, -3.0]], [[4.0, 0.0, -1.0]], [[1.0, 1.0, 1.0]])
    assert loss == pytest.approx((-4 * math.exp(0.1) + 0.1 + 1) / 3, abs=1e-6)
    assert g.flatten().tolist() == pytest.approx([(-4 * math.exp(0.1) + 1) / 3, 0.0, 1 / 3], abs=1e-6)
    assert m["kl_cov_frac"] == pytest.approx(1 / 3)


def test_opsm_by_hand():
    # two one-token sequences, each KL(old || new) = old - lp = 0.5 > 1e-4: the one with A = -1 leaves the loss; the
    # other (A = +1, ratio e^-0.5 = 0.6065 < 0.8: PPO keeps -A r = -0.6065). Sample mean (0 - 0.6065) / 2
    p = params(use_opsm=True, use_rollout_logprobs=True)
    loss, g, m = _run(p, [[-1.5], [-1.5]], [[-1.0], [-1.0]], [[-1.0], [1.0]], [[1.0], [1.0]])
    assert loss == pytest.approx(-math.exp(-0.5) / 2, abs=1e-6) and g[0, 0].item() == 0.0 and g[1, 0].item() < 0
    assert m["opsm_maskfrac"] == 0.5
    # under the threshold nothing is masked
    _, _, m = _run(params(use_opsm=True, use_rollout_logprobs=True, opsm_delta=0.6), [[-1.5], [-1.5]],
                   [[-1.0], [-1.0]], [[-1.0], [1.0]], [[1.0], [1.0]])
    assert m["opsm_maskfrac"] == 0.0


def test_high_entropy_tokens_by_hand_and_as_trl():
    # entropies [0.1, 0.5, 0.9, 1.3], ratio 0.5: the 0.5 quantile is 0.7, tokens 3 and 4 keep the gradient.
    # on-policy, A = 1: loss -1 on kept tokens, token mean over all 4 tokens -0.5; grads -1/4 on kept tokens
    ent = [[0.1, 0.5, 0.9, 1.3]]
    loss, g, m = _run(params(high_entropy_token_ratio=0.5, calculate_per_token_loss=True), [[-1.0] * 4],
                      [[-1.0] * 4], [[1.0] * 4], [[1.0] * 4], entropy=ent)
    assert loss == pytest.approx(-0.5) and g.flatten().tolist() == pytest.approx([0.0, 0.0, -0.25, -0.25])
    assert m["entropy_keepfrac"] == 0.5 and m["entropy_kept"] == pytest.approx((0.9 + 1.3) / 4)
    # TRL's mask (GRPOTrainer.get_high_entropy_mask, with a real single-process Accelerator) on a random batch
    from accelerate import Accelerator
    from trl.trainer.grpo_trainer import GRPOTrainer
    from slick.algo.token_filters import high_entropy_keep
    g = torch.Generator().manual_seed(3)
    ent, mask = torch.rand(5, 11, generator=g) * 3, (torch.rand(5, 11, generator=g) > 0.3).float()
    for ratio in (0.2, 0.5, 0.8):
        ref = GRPOTrainer.get_high_entropy_mask(SimpleNamespace(accelerator=Accelerator(cpu=True)), ent, mask,
                                                1 - ratio)
        assert torch.equal(high_entropy_keep(ent, mask, ratio).bool(), ref)

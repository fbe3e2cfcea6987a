"""The dataclass inputs (AdvantageInputs, LossInputs): the same numbers as the positional signature they
replaced, shape errors naming the field, and custom functions for the old signature refused by name."""
import json
from pathlib import Path

import pytest
import torch

from tests.algo_params import params
from slick.algo import (ESTIMATORS, AdvantageInputs, AdvantageOutputs, LossInputs, check_plugin_signature,
                        compute_policy_objective)

# Written by the code before the dataclasses (commit 6861748, estimator(rewards, mask, *, group_size, cfg,
# old_logprobs, ref_logprobs, values) and compute_policy_objective(cfg, logprobs, entropy, mask, ...)) on the
# inputs below: one entry per estimator and group size, and per loss configuration (loss, metrics, gradient).
BEFORE = json.loads((Path(__file__).parent / "algo_values_before_dataclasses.json").read_text())

R = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 3.0])
M = torch.tensor([[1, 1, 0, 0], [1, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]],
                 dtype=torch.float32)
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -1.1, -0.7, -2.2], [-0.9, -0.3, -1.4, -0.1],
                    [-2.0, -0.6, -0.8, -1.9], [-0.4, -1.7, -0.25, -0.75], [-1.3, -0.5, -0.5, -0.5]])
REF = OLD + torch.tensor([[0.1, -0.2, 0.3, 0.0], [0.5, 0.0, -0.4, 0.2], [-0.1, 0.1, 0.2, -0.3],
                          [0.0, 0.3, -0.2, 0.1], [0.25, -0.5, 0.0, 0.4], [-0.3, 0.0, 0.0, 0.0]])
V = torch.tensor([[0.5, 0.25, 9.0, 9.0], [1.0, 7.0, 0.5, 0.75], [0.1, 0.2, 0.3, 9.0], [9.0, 0.4, 0.6, 0.8],
                  [0.0, 0.5, 1.0, 1.5], [2.0, 9.0, 9.0, 9.0]])
LOGP = OLD + torch.tensor([[0.1, 0.5, -0.5, 1.5], [0.05, -0.3, 0.2, 0.0], [0.0, 0.1, -0.1, 0.2],
                           [0.3, -0.2, 0.4, -0.6], [0.15, 0.0, -0.05, 0.1], [0.7, 0.0, 0.0, 0.0]])
ENT = torch.rand(6, 4, generator=torch.Generator().manual_seed(0))
ROLL = OLD - 0.1 * torch.arange(24).view(6, 4).float() / 24
ADV = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
LOSS_CFGS = {
    "plain": params(),
    "full": params(eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=3.0, entropy_coef=0.01, use_kl_loss=True,
               kl_loss_coef=0.1, kl_loss_type="low_var_kl", use_tis=True, tis_clip=2.0, tis_clip_low=0.5),
    "gspo_tok": params(advantage_estimator="gspo", calculate_per_token_loss=True, eps_clip=0.2),
}


def exact(t, values):
    assert torch.equal(t, torch.tensor(values, dtype=torch.float32)), (t, values)


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("group_size", [1, 3])
def test_every_estimator_gives_exactly_the_values_before_the_dataclasses(name, group_size):
    cfg = params(kl_coef=0.05, gamma=0.9, lambd=0.8)
    out = ESTIMATORS[name](AdvantageInputs(R, M, group_size, cfg, OLD, REF, V))
    assert isinstance(out, AdvantageOutputs)
    adv, ret = BEFORE[f"{name}/{group_size}"]
    exact(out.advantages, adv)
    exact(out.returns, ret)


@pytest.mark.parametrize("which", sorted(LOSS_CFGS))
def test_objective_gives_exactly_the_values_before_the_dataclasses(which):
    lp = LOGP.clone().requires_grad_(True)
    loss, metrics = compute_policy_objective(LOSS_CFGS[which], LossInputs(
        lp, ENT, M, ADV, old_logprobs=OLD, ref_logprobs=REF, rollout_logprobs=ROLL, num_samples=8, num_tokens=20))
    (g,) = torch.autograd.grad(loss, lp)
    want_loss, want_metrics, want_grad = BEFORE[f"loss/{which}"]
    assert float(loss.detach()) == want_loss
    assert metrics == want_metrics
    within_one_ulp(g, want_grad)


def within_one_ulp(t, values):
    """The stored values were written on an AVX2 CPU; on AVX-512 torch sums some reductions in another order,
    which moved one gradient entry by one fp32 ulp (gspo_tok, 9.3e-10). Anything more is a real change."""
    want = torch.tensor(values, dtype=torch.float32)
    ulp = torch.nextafter(want.abs(), torch.tensor(float("inf"))) - want.abs()
    assert bool(((t - want).abs() <= ulp).all()), (t - want).abs().max()


def test_shape_errors_name_the_field():
    with pytest.raises(ValueError, match=r"AdvantageInputs.values has shape \(6, 3\); it must match mask \(6, 4\)"):
        AdvantageInputs(R, M, 3, values=V[:, :3])
    with pytest.raises(ValueError, match=r"AdvantageInputs.mask must be a \[B, T\] tensor"):
        AdvantageInputs(R, M[0], 3)
    with pytest.raises(ValueError, match=r"LossInputs.old_logprobs has shape \(6, 2\)"):
        LossInputs(LOGP, None, M, ADV, old_logprobs=OLD[:, :2])
    with pytest.raises(TypeError, match="inputs must be a slick.algo.LossInputs, got Tensor"):
        compute_policy_objective(params(), LOGP)
    # rewards given as a list become a float tensor on the mask's device
    assert AdvantageInputs([1, 2], torch.ones(2, 1), 1).rewards.dtype == torch.float32


def new_estimator(inputs):
    return AdvantageOutputs(inputs.mask, inputs.mask)


def old_estimator(rewards, mask, *, group_size, cfg=None, **kw):
    return mask, mask


def old_estimator_with_defaults(rewards=None, mask=None, group_size=1):
    return mask, mask


def new_loss(cfg, inputs):
    return inputs.logprobs.sum(), {}


def old_loss(cfg, logprobs, entropy, mask, advantages, **kw):
    return logprobs.sum(), {}


def test_custom_functions_for_the_old_signature_are_refused_by_flag():
    adv_flag, loss_flag = "--custom-advantage-function-path", "--custom-loss-function-path"
    assert check_plugin_signature(new_estimator, adv_flag) is new_estimator
    assert check_plugin_signature(new_loss, loss_flag) is new_loss
    with pytest.raises(ValueError, match=r"^--custom-advantage-function-path: old_estimator\(rewards, mask, \*, "
                       r"group_size, cfg=None, \*\*kw\) has parameter\(s\) group_size, mask, rewards of the old "
                       r"positional signature; the signature is now fn\(inputs: slick.algo.AdvantageInputs\) -> "
                       r"slick.algo.AdvantageOutputs"):
        check_plugin_signature(old_estimator, adv_flag)
    with pytest.raises(ValueError, match="old_estimator_with_defaults.*has parameter"):
        check_plugin_signature(old_estimator_with_defaults, adv_flag)
    with pytest.raises(ValueError, match=r"^--custom-loss-function-path: old_loss.*the signature is now "
                       r"fn\(cfg, inputs: slick.algo.LossInputs\)"):
        check_plugin_signature(old_loss, loss_flag)
    # a loss taking only one argument cannot receive (cfg, inputs)
    with pytest.raises(ValueError, match=r"--custom-loss-function-path: new_estimator\(inputs\) cannot be called "
                       r"with 2 positional argument\(s\)"):
        check_plugin_signature(new_estimator, loss_flag)

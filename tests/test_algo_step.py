"""slick.algo.assemble.Advantages.compute builds AdvantageInputs from samples: per-sample critic values go in,
tool tokens (loss mask 0) are skipped, old-signature custom estimators are refused by flag."""
import sys

import pytest
import torch

from slick.config import Config
from slick.algo.assemble import Advantages, objective_from_config
from slick.types import Sample


def cfg(**kw):
    base = dict(n_samples_per_prompt=2, advantage_estimator="ppo", normalize_advantages=False, gamma=0.9, lambd=0.5,
                kl_coef=0.0, custom_advantage_function_path=None, custom_loss_function_path=None)
    base.update(kw)
    return Config.from_flat(base)


def samples():
    # sample 0: a tool call in the middle (t1, t2) and one more tool token (t4); sample 1: three plain tokens
    return [Sample(index=0, response_ids=[5] * 6, loss_mask=[1, 0, 0, 1, 0, 1]),
            Sample(index=1, response_ids=[5] * 3, loss_mask=[1, 1, 1])]


def close(a, b):
    torch.testing.assert_close(a, torch.tensor(b, dtype=a.dtype), atol=1e-6, rtol=1e-6)


def test_critic_values_reach_gae_per_sample():
    values = [torch.tensor([0.2, 5.0, 5.0, 0.4, 5.0, 0.5]), torch.tensor([0.5, 0.5, 0.5])]
    adv, ret = Advantages.from_config(cfg()).compute(samples(), [1.0, 0.0], values=values, with_returns=True)
    # sample 0 as in test_algo_value: counted (r, V) = (0, .2) (0, .4) (1, .5), gamma .9, lambda .5 ->
    #   A = 0.28375, 0.275, 0.5 on t0, t3, t5; returns A + V = 0.48375, 0.675, 1.0
    close(adv[0], [0.28375, 0, 0, 0.275, 0, 0.5])
    close(ret[0], [0.48375, 0, 0, 0.675, 0, 1.0])
    # sample 1, reward 0, V = 0.5 everywhere: t2 delta = -0.5, A = -0.5; t1 delta = 0.45 - 0.5 = -0.05,
    #   A = -0.05 + 0.45 * -0.5 = -0.275; t0 delta = -0.05, A = -0.05 + 0.45 * -0.275 = -0.17375
    close(adv[1], [-0.17375, -0.275, -0.5])
    close(ret[1], [0.32625, 0.225, 0.0])


def test_ppo_without_a_critic_uses_zero_values():
    # V = 0: sample 0 counted rewards (0, 0, 1): A = 1 on t5, 0.45 on t3, 0.45^2 = 0.2025 on t0
    adv = Advantages.from_config(cfg()).compute(samples(), [1.0, 0.0])
    close(adv[0], [0.2025, 0, 0, 0.45, 0, 1.0])
    close(adv[1], [0.0, 0.0, 0.0])


def test_values_must_match_the_samples():
    with pytest.raises(ValueError, match=r"2 samples but 1 values"):
        Advantages.from_config(cfg()).compute(samples(), [1.0, 0.0], values=[torch.zeros(6)])
    with pytest.raises(ValueError, match=r"values\[1\] has 4 values for a response of 3 tokens"):
        Advantages.from_config(cfg()).compute(samples(), [1.0, 0.0], values=[torch.zeros(6), torch.zeros(4)])


OLD_STYLE = '''
def advantage(rewards, mask, *, group_size, cfg=None, **kw):
    return mask, mask

def loss(cfg, logprobs, entropy, mask, advantages, **kw):
    return logprobs.sum(), {}

def returns_tuple(inputs):
    return inputs.mask, inputs.mask
'''


def test_old_signature_custom_functions_are_refused(tmp_path):
    (tmp_path / "old_style_algo.py").write_text(OLD_STYLE)
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ValueError, match=r"^--custom-advantage-function-path: advantage\(rewards, mask.*"
                           r"the signature is now fn\(inputs: slick.algo.AdvantageInputs\)"):
            Advantages.from_config(cfg(custom_advantage_function_path="old_style_algo.advantage")).compute(samples(), [1.0, 0.0])
        with pytest.raises(ValueError, match=r"^--custom-loss-function-path: loss\(cfg, logprobs"):
            objective_from_config(cfg(custom_loss_function_path="old_style_algo.loss"))
        with pytest.raises(TypeError, match="returned tuple; it must return slick.algo.AdvantageOutputs"):
            Advantages.from_config(cfg(custom_advantage_function_path="old_style_algo.returns_tuple")).compute(samples(),
                               [1.0, 0.0])
        # slick train refuses them while validating the flags, before any model loads
        from slick.config import ConfigError
        from slick.configure import parse_config
        from slick.configure.validate import validate_config
        parsed = parse_config(["--custom-advantage-function-path", "old_style_algo.advantage",
                               "--custom-loss-function-path", "old_style_algo.loss"], validate=False)
        with pytest.raises(ConfigError) as e:
            validate_config(parsed, check_files=False)
        msg = str(e.value)
        assert "--custom-advantage-function-path: advantage(rewards, mask" in msg
        assert "--custom-loss-function-path: loss(cfg, logprobs" in msg
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("old_style_algo", None)

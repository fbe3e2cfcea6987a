"""The training phase (slick.loop.step) with a real tiny model: the logprobs each estimator needs are computed."""
import pytest
import torch

from slick.algo.assemble import objective_from_config
from slick.loop.step import train_on_samples
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples


@pytest.mark.parametrize("estimator", ["ppo", "reinforce_plus_plus"])
def test_kl_coef_gets_old_and_ref_logprobs(tiny_model_dir, estimator):
    """--kl-coef shapes token rewards with old - ref logprobs: both are computed (PPO failed here before).
    Before the first step old == ref, so the KL term is 0 and (gamma = lambd = 1, zero values) PPO's advantage
    on every token is the sample's reward."""
    cfg = make_cfg(tiny_model_dir, advantage_estimator=estimator, kl_coef=0.1, rollout_batch_size=2,
                   n_samples_per_prompt=2)
    assert cfg.num_steps_per_rollout == 1
    tr = Trainer(cfg)
    samples = make_samples(4)
    rewards = [1.0, 0.0, 0.5, 0.25]
    metrics, tensors = train_on_samples(cfg, tr, samples, rewards, objective_from_config(cfg), step=0)
    assert tr.version == 1 and metrics["train/skipped_steps"] == 0.0
    for old, ref in zip(tensors["old_logprobs"], tensors["ref_logprobs"]):
        assert torch.allclose(old, ref, atol=1e-6)
    if estimator == "ppo":
        for adv, r, s in zip(tensors["advantages"], rewards, samples):
            assert torch.allclose(adv, torch.full((len(s.response_ids),), r), atol=1e-5)

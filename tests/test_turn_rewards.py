"""Turn-level rewards and credit (slick/algo/turns.py): per-turn rewards reach the right tokens, exact values."""
import math

import pytest
import torch

from slick.algo.assemble import Advantages
from slick.algo.turns import discounted_returns, turn_spans
from slick.config import Config
from slick.reward.hub import check_reward
from slick.rollout.env import env_turn_rewards
from slick.types import Sample

# Episode A: three turns (mask runs [0,2), [3,4), [5,6)) rewarded 1, 0, 4; episode B: two turns ([0,1), [3,5))
# rewarded 1, 3. With gamma 0.5: G_A = [1 + 0.5*2, 0 + 0.5*4, 4] = [2, 2, 4]; G_B = [1 + 0.5*3, 3] = [2.5, 3].
MASK_A, MASK_B = [1, 1, 0, 1, 0, 1], [1, 0, 0, 1, 1]


def sample(mask, reward, index):
    return Sample(index=index, response_ids=list(range(len(mask))), loss_mask=list(mask),
                  rollout_logprobs=[0.0] * len(mask), reward=check_reward(reward))


def advantages(rewards, masks, **flags):
    cfg = Config.from_flat({"n_samples_per_prompt": len(masks), "turn_gamma": 0.5, **flags})
    samples = [sample(m, r, i) for i, (m, r) in enumerate(zip(masks, rewards))]
    adv = Advantages.from_config(cfg).compute(samples, [s.reward["reward"] if isinstance(s.reward, dict) else s.reward
                                                        for s in samples])
    return [a.tolist() for a in adv]


def test_turn_spans_and_discounted_returns():
    assert turn_spans([0, 1, 1, 0, 0, 1, 0, 1]) == [(1, 3), (5, 6), (7, 8)]
    assert turn_spans([0, 0]) == []
    assert discounted_returns([1, 0, 4], 0.5) == [2.0, 2.0, 4.0]
    assert discounted_returns([1, 0, 4], 1.0) == [5.0, 4.0, 4.0]


def test_a_list_reward_is_kept_per_turn():
    assert check_reward([1, 0, 4]) == {"reward": 5.0, "turn_rewards": [1.0, 0.0, 4.0]}
    with pytest.raises(ValueError, match="empty"):
        check_reward([])
    with pytest.raises(ValueError, match="not finite"):
        check_reward([1.0, float("nan")])


def test_episode_norm_puts_each_turns_advantage_on_its_tokens():
    # baseline: mean of the episode returns G_0 = (2 + 2.5) / 2 = 2.25 (Dr.GRPO: no std division)
    a, b = advantages([[1, 0, 4], [1, 3]], [MASK_A, MASK_B], disable_grpo_std_normalization=True)
    assert a == [-0.25, -0.25, 0.0, -0.25, 0.0, 1.75]
    assert b == [0.25, 0.0, 0.0, 0.75, 0.75]
    # with the std of (2, 2.5): sqrt(0.125)
    a, b = advantages([[1, 0, 4], [1, 3]], [MASK_A, MASK_B])
    s = math.sqrt(0.125) + 1e-6
    assert a == pytest.approx([-0.25 / s, -0.25 / s, 0, -0.25 / s, 0, 1.75 / s], abs=1e-6)
    assert b == pytest.approx([0.25 / s, 0, 0, 0.75 / s, 0.75 / s], abs=1e-6)


def test_turn_norm_compares_returns_at_the_same_position():
    # position 0: (2, 2.5) mean 2.25; position 1: (2, 3) mean 2.5; position 2: A alone -> 0
    a, b = advantages([[1, 0, 4], [1, 3]], [MASK_A, MASK_B], disable_grpo_std_normalization=True,
                      turn_advantage_norm="turn")
    assert a == [-0.25, -0.25, 0.0, -0.5, 0.0, 0.0]
    assert b == [0.25, 0.0, 0.0, 0.5, 0.5]


def test_raw_returns_without_reward_normalisation():
    a, b = advantages([[1, 0, 4], [1, 3]], [MASK_A, MASK_B], disable_rewards_normalization=True)
    assert a == [2.0, 2.0, 0.0, 2.0, 0.0, 4.0] and b == [2.5, 0.0, 0.0, 3.0, 3.0]


def test_a_final_reward_with_gamma_one_is_grpo():
    # one sample with a per-turn list [0, 0, R] among scalar ones: the same advantages as GRPO on the scalars
    masks, finals = [MASK_A, MASK_B, [1, 0, 1]], [1.0, 3.0, 0.0]
    cfg = Config.from_flat({"n_samples_per_prompt": 3})
    plain = [sample(m, r, i) for i, (m, r) in enumerate(zip(masks, finals))]
    grpo = Advantages.from_config(cfg).compute(plain, finals)
    turned = [sample(MASK_A, [0.0, 0.0, 1.0], 0)] + plain[1:]
    per_turn = Advantages.from_config(cfg).compute(turned, finals)
    for x, y in zip(grpo, per_turn):
        assert torch.allclose(x, y, atol=1e-6)
    assert grpo[0][0].item() == pytest.approx((1.0 - 4 / 3) / (math.sqrt(7 / 3) + 1e-6), abs=1e-6)


def test_wrong_count_of_turn_rewards_names_the_sample():
    with pytest.raises(ValueError, match="sample 1 has 2 policy turn.s. but 3 per-turn rewards"):
        advantages([[1, 0, 4], [1, 3, 5]], [MASK_A, MASK_B])
    with pytest.raises(ValueError, match="per-turn rewards need --advantage-estimator"):
        advantages([[1, 0, 4], [1, 3]], [MASK_A, MASK_B], advantage_estimator="reinforce_plus_plus")


def test_environment_rewards_by_turn():
    s = Sample(index=0, metadata={"multiturn": {"turns": 3, "env_turn_rewards": [0.5, 0.0]}})
    assert env_turn_rewards(None, s) == [0.5, 0.0, 0.0]
    assert env_turn_rewards(None, Sample(index=1, metadata={"multiturn": {"turns": 2}})) == [0.0, 0.0]


def per_turn_rm(args, sample):
    return sample.metadata["want"]


def test_the_reward_hub_keeps_per_turn_lists_and_fails_a_wrong_count():
    import asyncio

    from slick.reward.hub import RewardHub
    hub = RewardHub(Config.from_flat({"custom_rm_path": "tests.test_turn_rewards.per_turn_rm",
                                      "rm_failure_reward": -1.0}))
    good = Sample(index=0, loss_mask=MASK_A, metadata={"want": [1, 0, 4]}, response="x")
    wrong = Sample(index=1, loss_mask=MASK_B, metadata={"want": [1, 0, 4]}, response="x")

    async def go():
        await hub.score_group([good, wrong])
        await hub.close()
    asyncio.run(go())
    assert good.reward == {"reward": 5.0, "turn_rewards": [1.0, 0.0, 4.0]}
    assert wrong.reward == -1.0 and "3 per-turn rewards for 2 policy turn(s)" in wrong.metadata["reward_error"]

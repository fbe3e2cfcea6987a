"""PPO's critic on a real local Ray cluster: one critic inside each of 2 trainer rank actors (FSDP2 over gloo)."""
import asyncio
import json
from pathlib import Path

import pytest

from slick.config import Config
from slick.configure.validate import validate_config
from slick.loop.sync import train
from tests.test_loop import learnable_task

CRITIC_KEYS = ("critic/value_loss", "critic/vf_clipfrac", "critic/explained_variance", "critic/values_mean",
               "critic/returns_mean", "critic/grad_norm")


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_ppo_critic_on_two_ray_ranks_saves_and_resumes_in_one_process(tmp_path, monkeypatch):
    """2 colocated trainer ranks with their critics: critic metrics every step, the critic's sharded checkpoint in
    critic/ of the step dir, and a one-process run resumes actor and critic from it."""
    model, prompts = learnable_task(tmp_path, monkeypatch)
    values = dict(hf_checkpoint=str(model), prompt_data=str(prompts), rollout_batch_size=4, n_samples_per_prompt=2,
                  rollout_max_response_len=4, custom_rm_path="target_rm.first_token_is_target", lr=1e-3,
                  num_rollout=3, dtype="fp32", run_dir=str(tmp_path / "run"), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, actor_num_gpus_per_node=2, colocate=True,
                  dist_timeout=120.0, ray_start_timeout=120.0, advantage_estimator="ppo", critic_lr=1e-3,
                  num_critic_only_steps=1, save=str(tmp_path / "ck"))
    cfg = validate_config(Config.from_flat(values))
    run = asyncio.run(asyncio.wait_for(train(cfg), 600))
    assert run.processes.cluster is None and run.train_parts.trainer.world_size == 2
    assert run.train_parts.trainer.version == 2 and run.train_parts.critic.version == 3
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(key in r for r in rows for key in CRITIC_KEYS)
    assert "train/loss" not in rows[0] and "train/loss" in rows[2]
    critic_dir = tmp_path / "ck" / "step_000003" / "critic"
    assert (critic_dir / "dcp" / ".metadata").is_file()   # sharded by the 2 ranks
    values.update(actor_num_gpus_per_node=0, colocate=False, num_rollout=4, load=str(tmp_path / "ck"),
                  run_dir=str(tmp_path / "run1"), save=None)
    run1 = asyncio.run(asyncio.wait_for(train(validate_config(Config.from_flat(values))), 300))
    assert run1.steps.start == 3 and run1.train_parts.trainer.version == 3 and run1.train_parts.critic.version == 4
    assert all(key in read_jsonl(tmp_path / "run1" / "metrics.jsonl")[-1] for key in CRITIC_KEYS)

"""LoRA end to end: `slick train` and `slick train-async` with adapters, the weight check after every sync,
GRPO learning the tiny task, PPO (full-weight critic) with a KL reference, a checkpoint and an export."""
import asyncio

import pytest

from slick.loop.sync import train
from slick.loop.train_async import train_async
from tests.test_loop import learnable_task, make_cfg, prompts, read_jsonl  # noqa: F401 - prompts is a fixture


def test_lora_learns_the_tiny_task_and_every_sync_is_checked(tmp_path, monkeypatch):
    model, data = learnable_task(tmp_path, monkeypatch)
    cfg = make_cfg(model, data, tmp_path / "run", num_rollout=12, rollout_batch_size=4, n_samples_per_prompt=8,
                   rollout_max_response_len=4, lr=5e-3, lora_rank=8, custom_rm_path="target_rm.first_token_is_target")
    run = asyncio.run(train(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    rewards = [r["rollout/raw_reward"] for r in rows]
    assert rewards[0] < 0.5 and sum(rewards[-4:]) / 4 > 0.9, rewards
    # the engine checked after every sync: version and a probe's logprobs within the fp32 bound (1e-3)
    checks = [r["perf/weight_check_max_abs_diff"] for r in rows]
    assert len(checks) == 12 and max(checks) <= 1e-3
    assert asyncio.run(run.rollout_parts.engines.engine.get_weight_version()) == run.train_parts.trainer.version == 12


def test_lora_ppo_async_with_kl_saves_and_resumes(tiny_model_dir, prompts, tmp_path):  # noqa: F811
    common = dict(lora_rank=4, lr=1e-2, advantage_estimator="ppo", use_kl_loss=True, kl_loss_coef=0.1,
                  n_samples_per_prompt=1, rollout_batch_size=4, max_staleness=1, use_tis=True,
                  save=str(tmp_path / "ck"), save_interval=1)
    cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=2, **common)
    run = asyncio.run(train_async(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("perf/weight_check_max_abs_diff" in r for r in rows)
    # step 1: B = 0, the actor is exactly the reference (the adapters disabled); step 2: the adapters moved it
    assert rows[0]["train/kl_loss"] == 0.0 and abs(rows[1]["train/kl_loss"]) > 1e-4
    assert run.train_parts.critic is not None and run.train_parts.critic.lora is None   # the critic keeps full weights
    assert (tmp_path / "ck" / "step_000002" / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "ck" / "step_000002" / "model").exists()
    cfg2 = make_cfg(tiny_model_dir, prompts, tmp_path / "run2", num_rollout=3, load=str(tmp_path / "ck"), **common)
    run2 = asyncio.run(train_async(cfg2))
    assert run2.train_parts.trainer.version == 3
    assert [r["step"] for r in read_jsonl(tmp_path / "run2" / "metrics.jsonl")] == [3]

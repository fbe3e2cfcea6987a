"""Dynamic sampling with over-sampling, and training from saved rollouts (no engine)."""
import asyncio
import json
import sys

import pytest

from slick.loop.sync import train
from tests.test_loop import make_cfg, read_jsonl

PARITY_RM = '''
def first_even(args, sample):
    """1 when the first response token id is even: a group of 2 has equal rewards half the time."""
    return float(sample.response_ids[0] % 2 == 0)
'''


@pytest.fixture()
def parity_prompts(tmp_path):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(16)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "parity_rm.py").write_text(PARITY_RM)
    sys.path.insert(0, str(tmp_path))
    yield path
    sys.path.remove(str(tmp_path))


def test_dynamic_sampling_keeps_only_groups_with_spread(tiny_model_dir, parity_prompts, tmp_path):
    cfg = make_cfg(tiny_model_dir, parity_prompts, tmp_path / "run", num_rollout=3, rollout_batch_size=2,
                   n_samples_per_prompt=2, custom_rm_path="parity_rm.first_even", over_sampling_batch_size=3,
                   dynamic_sampling_filter_path="slick.rollout.filters.check_reward_nonzero_std",
                   save_debug_rollout_data=str(tmp_path / "rollouts"))
    asyncio.run(train(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    for step in range(3):
        samples = read_jsonl(tmp_path / "rollouts" / f"rollout_{step}.jsonl")
        groups = {}
        for s in samples:
            groups.setdefault(s["group_index"], []).append(s["reward"])
        assert len(groups) == 2 and all(len(set(g)) == 2 for g in groups.values()), groups
        assert all(s["status"] in ("completed", "truncated") for s in samples)
    assert sum(r["rollout/filtered_groups"] for r in rows) > 0  # P(no group filtered in 3 steps) is tiny
    assert all(r["rollout/zero_std/count"] == 0 for r in rows)


def test_train_from_saved_rollouts_without_an_engine(tiny_model_dir, parity_prompts, tmp_path):
    first = make_cfg(tiny_model_dir, parity_prompts, tmp_path / "a", num_rollout=2,
                     custom_rm_path="parity_rm.first_even", save_debug_rollout_data=str(tmp_path / "rollouts"))
    asyncio.run(train(first))
    replay = make_cfg(tiny_model_dir, parity_prompts, tmp_path / "b", num_rollout=2,
                      custom_rm_path="parity_rm.first_even", load_debug_rollout_data=str(tmp_path / "rollouts"))
    run = asyncio.run(train(replay))
    assert run.rollout_parts.engines is None and run.train_parts.trainer.version == 2
    a, b = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["rollout/raw_reward"] for r in a] == [r["rollout/raw_reward"] for r in b]
    # same batch and same initial weights: the same gradient
    assert a[0]["train/grad_norm"] == pytest.approx(b[0]["train/grad_norm"], rel=1e-4)


def test_weight_sync_every_other_step_still_trains_every_step(tiny_model_dir, parity_prompts, tmp_path):
    cfg = make_cfg(tiny_model_dir, parity_prompts, tmp_path / "run", num_rollout=4,
                   custom_rm_path="parity_rm.first_even", update_weights_interval=2)
    assert cfg.max_staleness == 1  # derived: the engine lags one optimizer step between syncs
    run = asyncio.run(train(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all("train/loss" in r for r in rows) and run.train_parts.trainer.version == 4
    assert ["perf/update_weights_time" in r for r in rows] == [False, True, False, True]
    assert asyncio.run(run.rollout_parts.engines.engine.get_weight_version()) == 4

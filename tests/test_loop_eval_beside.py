"""`slick train` evaluates step n's weights beside step n + 1's rollout (slick/loop/sync.py): the two share the
engine's decode steps, and no number of the run changes. A tiny random model, the real engine and trainer."""
import asyncio

import pytest

from slick.loop.run import Run
from slick.loop.sync import train
from tests.test_loop import make_cfg, prompts, read_jsonl  # noqa: F401 - prompts is a fixture


def _run(tiny_model_dir, prompts, run_dir, **over):
    cfg = make_cfg(tiny_model_dir, prompts, run_dir, eval_prompt_data=["held", str(prompts)], eval_interval=1,
                   n_samples_per_eval_prompt=2, save_debug_train_data=str(run_dir / "dbg"), **over)
    run = asyncio.run(train(cfg))
    return run, read_jsonl(run_dir / "metrics.jsonl")


def test_the_evaluation_beside_the_next_rollout_changes_no_number(tiny_model_dir, prompts, tmp_path, monkeypatch):
    run, beside = _run(tiny_model_dir, prompts, tmp_path / "beside")
    steps_beside = run.rollout_parts.engines.engine.stats()["decode_steps"]
    assert run.evaluates_beside_rollout
    with monkeypatch.context() as m:
        m.setattr(Run, "evaluates_beside_rollout", property(lambda self: False))
        run, alone = _run(tiny_model_dir, prompts, tmp_path / "alone")
        steps_alone = run.rollout_parts.engines.engine.stats()["decode_steps"]
    # one line per step, each evaluation logged with its step (step 0: the weights before training)
    assert [r["step"] for r in beside] == [r["step"] for r in alone] == [0, 1, 2, 3]
    for b, a in zip(beside, alone):
        assert b["eval/held/response_len"] == a["eval/held/response_len"] == 8.0
        assert b["eval/held"] == a["eval/held"]
        if b["step"]:
            assert b["train/loss"] == pytest.approx(a["train/loss"], rel=1e-5, abs=1e-7)
            assert b["rollout/raw_reward"] == a["rollout/raw_reward"]
    for step in (0, 1, 2):     # the same samples trained on (files by rollout step)
        rows_b = read_jsonl(tmp_path / "beside" / "dbg" / f"train_{step}.jsonl")
        rows_a = read_jsonl(tmp_path / "alone" / "dbg" / f"train_{step}.jsonl")
        assert [r["response_ids"] for r in rows_b] == [r["response_ids"] for r in rows_a]
    # alone: each of the 4 evaluations (24 requests) and 3 rollouts (8 requests) decodes its 8 tokens in 7 steps;
    # beside, evaluations 0-2 share their decode steps with rollouts 1-3
    assert steps_alone == 7 * 7
    assert 4 * 7 <= steps_beside < steps_alone


def test_a_filtered_rollout_keeps_the_evaluation_on_its_own(tiny_model_dir, prompts, tmp_path):
    """Over-sampling aborts the engine's leftover requests when the batch is full: an evaluation beside it
    would lose its own, so it runs alone."""
    (tmp_path / "keep_all.py").write_text("def keep(args, group):\n    return True\n")
    run, rows = _run(tiny_model_dir, prompts, tmp_path / "run", dynamic_sampling_filter_path="keep_all.keep",
                     over_sampling_batch_size=3)
    assert not run.evaluates_beside_rollout
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["eval/held/response_len"] == 8.0 for r in rows)

"""The demo's first step with the real SmolLM2-135M-Instruct (slow: loads the real model)."""
import json

import pytest


@pytest.mark.slow
def test_demo_first_step_runs(tmp_path, smollm2_dir):
    from slick.demo.__main__ import main

    run_dir = tmp_path / "demo"
    rc = main(["--num-rollout", "1", "--run-dir", str(run_dir), "--no-progress"])
    assert rc == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/heldout" in r]
    assert [r["step"] for r in evals] == [0, 1]  # before the first step and after the last
    step = [r for r in rows if "train/loss" in r]
    assert len(step) == 1 and step[0]["rollout/response_len/mean"] > 0
    assert step[0]["train/train_rollout_logprob_abs_diff"] < 0.1  # bf16 engine vs bf16 trainer
    assert (run_dir / "plots" / "reward.png").stat().st_size > 0

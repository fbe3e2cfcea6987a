"""The golden run (tests/golden_run.py): the working tree's four fixed-seed runs (GRPO, PPO with the critic, an
agent session, train-async with --max-staleness 0) give the stored metrics, and, on the CPU kind that stored
them, the same weights and token ids bit for bit. Also: the comparison reports each difference by name."""
import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import golden_run
from tests.golden_run import compare, cpu_signature, report, step_record, tensors_sha256

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "tests" / "golden" / "golden_run.json"


def stored() -> dict:
    return json.loads(STORED.read_text())


def run_golden(out: Path, timeout: float = 600) -> None:
    """``python -m tests.golden_run --out OUT`` on this working tree, in its own process group (nothing outlives
    the test)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.Popen([sys.executable, "-m", "tests.golden_run", "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, output[-4000:]


@pytest.mark.timeout(900)
def test_golden_run_matches_the_stored_run(tmp_path):
    """About 10 s on 2 cores: fast enough for `make test-fast`, so every change is checked against it."""
    run_golden(tmp_path / "now.json")
    now = json.loads((tmp_path / "now.json").read_text())
    ok, text = report(stored(), now)
    print(text)                                      # which mode: exact (same CPU kind) or tolerance
    assert ok, text


# ------------------------------------------------------------------------------------------ the stored file
def test_stored_run_holds_the_four_runs():
    data = stored()
    assert sorted(data["runs"]) == ["agent", "async", "grpo", "ppo"]
    assert {n: sorted(r["steps"]) for n, r in data["runs"].items()} == \
        {"grpo": ["1", "2", "3"], "ppo": ["1", "2", "3"], "agent": ["1", "2"], "async": ["1", "2", "3"]}
    assert "critic_weights_sha256" in data["runs"]["ppo"]
    for r in data["runs"].values():
        assert len(r["weights_sha256"]) == 64
        for step in r["steps"].values():
            assert len(step["token_ids_sha256"]) == 64
            assert not any(golden_run.volatile(k) for k in step["metrics"])
            assert "train/loss" in step["metrics"] and "advantages/std" in step["derived"]
    assert "critic/value_loss" in data["runs"]["ppo"]["steps"]["1"]["metrics"]
    assert data["runs"]["agent"]["steps"]["1"]["metrics"]["rollout/agent_calls/mean"] == 2.0
    assert data["runs"]["async"]["steps"]["3"]["metrics"]["rollout/staleness/max"] == 0
    assert set(data["cpu_signature"]) == set(cpu_signature())


# ------------------------------------------------------------------------------------------ the comparison
def test_identical_runs_compare_equal_in_exact_mode():
    a = stored()
    assert compare(a, copy.deepcopy(a)) == ("exact", [], [])


def test_every_difference_is_named():
    a = stored()
    b = copy.deepcopy(a)
    m = b["runs"]["ppo"]["steps"]["2"]["metrics"]
    m["critic/value_loss"] *= 1 + 1e-4                       # beyond the relative 1e-5
    m["train/grad_norm"] *= 1 + 1e-6                         # within it
    del b["runs"]["grpo"]["steps"]["3"]["metrics"]["train/kl_loss"]
    b["runs"]["async"]["steps"]["1"]["metrics"]["train/new_metric"] = 1.0
    b["runs"]["agent"]["weights_sha256"] = "0" * 64
    mode, diffs, ignored = compare(a, b)
    assert mode == "exact" and ignored == []
    names = sorted(d.split(":")[0] for d in diffs)
    assert names == ["agent/weights_sha256", "async/steps/1/metrics/train/new_metric",
                     "grpo/steps/3/metrics/train/kl_loss", "ppo/steps/2/metrics/critic/value_loss"]
    assert "relative 1.00e-04" in next(d for d in diffs if "value_loss" in d)


def test_another_cpu_kind_compares_metrics_only():
    a = stored()
    b = copy.deepcopy(a)
    b["cpu_signature"]["torch_cpu_capability"] = "AMX" if a["cpu_signature"]["torch_cpu_capability"] != "AMX" else "AVX512"
    b["runs"]["grpo"]["weights_sha256"] = "1" * 64
    b["runs"]["grpo"]["steps"]["1"]["token_ids_sha256"] = "2" * 64
    b["runs"]["grpo"]["steps"]["1"]["metrics"]["train/loss"] += 1e-9    # under the absolute floor
    b["runs"]["ppo"]["steps"]["2"]["metrics"]["train/train_rollout_logprob_abs_diff"] += 5e-6   # fp32 noise
    mode, diffs, ignored = compare(a, b)
    assert (mode, diffs) == ("tolerance", [])
    assert sorted(d.split(":")[0] for d in ignored) == ["grpo/steps/1/token_ids_sha256", "grpo/weights_sha256"]
    ok, text = report(a, b)
    assert ok and "tolerance mode" in text
    b["runs"]["grpo"]["steps"]["1"]["derived"]["rewards/mean"] += 0.01
    b["runs"]["ppo"]["steps"]["3"]["metrics"]["train/train_rollout_logprob_abs_diff"] += 2e-5   # past the floor
    ok, text = report(a, b)
    assert not ok and text.count("DIFF ") == 2 and "DIFF grpo/steps/1/derived/rewards/mean" in text
    assert "DIFF ppo/steps/3/metrics/train/train_rollout_logprob_abs_diff" in text


def test_compare_command_exit_status(tmp_path, capsys):
    a = stored()
    b = copy.deepcopy(a)
    b["runs"]["async"]["steps"]["2"]["metrics"]["train/loss"] = 123.0
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    assert golden_run.main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert golden_run.main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 1
    out = capsys.readouterr().out
    assert "DIFF async/steps/2/metrics/train/loss: stored" in out and "now 123.0" in out and "1 difference(s)" in out


# ------------------------------------------------------------------------------------------ what is recorded
@pytest.mark.parametrize("key,dropped", [("perf/step_time", True), ("time", True), ("train/fwd_bwd_time", True),
                                         ("reward/time_total_s", True), ("train/tokens_per_sec", True),
                                         ("reward/timeouts", False), ("train/tokens", False),
                                         ("rollout/truncated_ratio", False), ("critic/lr", False)])
def test_machine_metrics_are_not_recorded(key, dropped):
    assert golden_run.volatile(key) is dropped


def test_step_record_stats_and_token_hash():
    dump = [{"index": 0, "prompt_index": 0, "response_ids": [5, 6, 7], "loss_mask": [1, 1, 0], "reward": 1.0,
             "advantages": [0.5, 0.5, 9.0]},
            {"index": 1, "prompt_index": 0, "response_ids": [8], "loss_mask": [1], "reward": 0.0, "advantages": [-1.0]}]
    rec = step_record({"train/loss": 0.25, "perf/step_time": 3.0}, dump)
    assert rec["metrics"] == {"train/loss": 0.25}
    assert rec["derived"]["advantages/count"] == 3 and rec["derived"]["advantages/max"] == 0.5   # masked 9.0 out
    assert rec["derived"]["rewards/mean"] == 0.5 and rec["derived"]["tokens/trained"] == 3
    flipped = copy.deepcopy(dump)
    flipped[1]["response_ids"] = [9]
    assert step_record({}, flipped)["token_ids_sha256"] != rec["token_ids_sha256"]


def test_weight_hash_sees_one_bit_and_not_the_file_layout(tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 3, generator=g), torch.randn(5, generator=g)
    save_file({"a": a, "b": b}, str(tmp_path / "one.safetensors"))
    save_file({"b": b}, str(tmp_path / "x.safetensors"))
    save_file({"a": a}, str(tmp_path / "y.safetensors"))
    whole = tensors_sha256([tmp_path / "one.safetensors"])
    assert tensors_sha256([tmp_path / "x.safetensors", tmp_path / "y.safetensors"]) == whole
    bits = a.clone()
    bits.view(torch.int32)[0, 0] ^= 1                 # the last bit of one float
    save_file({"a": bits, "b": b}, str(tmp_path / "two.safetensors"))
    assert tensors_sha256([tmp_path / "two.safetensors"]) != whole

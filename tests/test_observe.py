"""Tests for slick.observe: JSONL/TensorBoard/wandb sinks, progress output, pass@k, plots."""
import io
import json
import math
import time
from pathlib import Path

import pytest

from slick.observe.metrics import MetricsCorruptError, MetricsLogger, read_metrics
from slick.rollout.passk import eval_metrics, pass_at_k
from slick.observe.progress import Progress


# ---------------------------------------------------------------- metrics.jsonl

def test_jsonl_roundtrip_and_flush(tmp_path):
    log = MetricsLogger(tmp_path)
    before = time.time()
    log.log({"rollout/raw_reward": 0.25, "train/loss": 1.5}, step=1)
    after = time.time()
    # flushed before close: another reader sees the line now
    rows = read_metrics(tmp_path)
    assert len(rows) == 1 and rows[0]["step"] == 1 and rows[0]["rollout/raw_reward"] == 0.25
    assert before <= rows[0]["time"] <= after           # wall-clock time of the log call
    log.log({"rollout/raw_reward": 0.5, "perf/step_time": 2.0, "train/ppo_kl": float("nan")}, step=2)
    log.close()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["perf/step_time"] == 2.0 and math.isnan(rows[1]["train/ppo_kl"])
    # every line is standalone JSON (no bare NaN tokens)
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in JSONL"))


def test_log_converts_tensor_scalars_and_rejects_bad(tmp_path):
    import numpy as np
    import torch

    with MetricsLogger(tmp_path) as log:
        out = log.log({"a": torch.tensor(0.5), "b": np.float32(2.0), "c": True, "d": None}, step=0)
        assert out == {"a": 0.5, "b": 2.0, "c": 1.0}
        with pytest.warns(UserWarning, match="'e' is not a number"):
            assert log.log({"e": "high", "f": 1}, step=1) == {"f": 1.0}
        with pytest.raises(ValueError, match="reserved"):
            log.log({"step": 3.0}, step=1)
    assert read_metrics(tmp_path)[0]["a"] == 0.5


def test_read_metrics_truncated_last_line_warns(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "time": 0, "x": 1.0}\n{"step": 2, "time": 0, "x": 2.0}\n{"step": 3, "ti')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3"):
        rows = read_metrics(tmp_path)
    assert [r["x"] for r in rows] == [1.0, 2.0]


def test_read_metrics_corrupt_middle_line_names_file_and_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"step": 1, "x": 1.0}\nnot json\n{"step": 3, "x": 3.0}\n')
    with pytest.raises(MetricsCorruptError, match=r"metrics.jsonl:2"):
        read_metrics(tmp_path)
    # a complete (newline-terminated) last line that is bad is not a crash artefact: error too
    p.write_text('{"step": 1, "x": 1.0}\n{"x": 2.0}\n')
    with pytest.raises(MetricsCorruptError, match=r"metrics.jsonl:2.*step"):
        read_metrics(tmp_path)
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_metrics(tmp_path / "nowhere")


def test_logger_appends_on_resume(tmp_path):
    with MetricsLogger(tmp_path, config={"lr": 1e-6}) as log:
        log.log({"x": 1.0}, step=1)
    with MetricsLogger(tmp_path) as log:
        log.log({"x": 2.0}, step=2)
    assert [r["x"] for r in read_metrics(tmp_path)] == [1.0, 2.0]
    assert json.loads((tmp_path / "config.json").read_text()) == {"lr": 1e-6}


# ---------------------------------------------------------------- TensorBoard

def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, use_tensorboard=True, config={"seed": 0}) as log:
        for step, r in [(1, 0.1), (2, 0.4), (3, 0.7)]:
            log.log({"rollout/raw_reward": r, "train/grad_norm": 10 * r}, step=step)
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert files and all(f.stat().st_size > 0 for f in files)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert {"rollout/raw_reward", "train/grad_norm"} <= set(acc.Tags()["scalars"])
    ev = acc.Scalars("rollout/raw_reward")
    assert [e.step for e in ev] == [1, 2, 3]
    assert [e.value for e in ev] == pytest.approx([0.1, 0.4, 0.7], rel=1e-6)
    assert [e.value for e in acc.Scalars("train/grad_norm")] == pytest.approx([1.0, 4.0, 7.0], rel=1e-6)


# ---------------------------------------------------------------- wandb (offline)

def _read_wandb_history(path):
    """Parse a .wandb file: 7-byte file header, then 32 KiB blocks of records with a 7-byte header
    (crc32, length, type: 1 full, 2 first, 3 middle, 4 last); each record is a wandb Record protobuf."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, buf, out = path.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            break
        buf += data[pos:pos + length]
        pos += length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                vals = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
                out.append((rec.history.step.num, vals))
    return out


def test_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    (tmp_path / "wb").mkdir()
    with MetricsLogger(tmp_path / "run", use_wandb=True, wandb_project="slick-test",
                       wandb_group="g", config={"lr": 1e-6}) as log:
        run = log._wandb_run
        assert run is not None and run.offline
        log.log({"rollout/raw_reward": 0.5}, step=1)
        log.log({"rollout/raw_reward": 0.75}, step=2)
        run_dir = Path(run.dir).parent
    # the offline run wrote a .wandb log (leveldb-style records of wandb protobufs); read our history back
    wandb_files = list(run_dir.glob("*.wandb"))
    assert len(wandb_files) == 1 and wandb_files[0].stat().st_size > 0
    # wandb's service process writes the log asynchronously: finish() can return with only the file header
    # on disk (seen ~1 run in 15). Wait for the records, at most 20 s.
    deadline = time.monotonic() + 20
    history = _read_wandb_history(wandb_files[0])
    while len(history) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        history = _read_wandb_history(wandb_files[0])
    assert [(step, vals["rollout/raw_reward"]) for step, vals in history] == [(1, 0.5), (2, 0.75)]
    assert str(run_dir).startswith(str(tmp_path / "wb"))
    # jsonl still written alongside
    assert [r["rollout/raw_reward"] for r in read_metrics(tmp_path / "run")] == [0.5, 0.75]


# ---------------------------------------------------------------- progress

def test_progress_disabled_prints_one_line_per_step():
    buf = io.StringIO()
    p = Progress(4, enabled=False, file=buf)
    p.update(1, {"rollout/raw_reward": 0.25, "perf/tokens_per_sec": 512.4})
    p.update(2, {"rollout/raw_reward": 0.5, "eval/addition": 0.7, "eval/addition-pass@4": 0.9})
    p.update(3, {"rollout/raw_reward": 0.625})
    p.write("saved checkpoint")
    p.close()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("step 1/4 | reward 0.250 | 512 tok/s | eta ")
    assert lines[1].startswith("step 2/4 | reward 0.500 | eval/addition 0.700 | eta ")
    # the last eval score stays visible on later steps
    assert "eval/addition 0.700" in lines[2] and lines[2].startswith("step 3/4 | reward 0.625")
    assert lines[3] == "saved checkpoint"


def test_progress_bar_enabled_writes_to_stream():
    buf = io.StringIO()
    p = Progress(3, enabled=True, file=buf)
    p.update(1, {"rollout/raw_reward": 0.125, "perf/tokens_per_sec": 100.0})
    p.write("hello above the bar")
    p.update(2, {"eval/math": 0.5})
    p.close()
    out = buf.getvalue()
    assert "2/3" in out and "reward=0.125" in out and "tok/s=100" in out and "eval/math=0.500" in out
    assert "hello above the bar" in out
    assert p.step == 2


def test_progress_eta_uses_pace():
    p = Progress(10, enabled=False, file=io.StringIO())
    assert p.eta_seconds() is None
    p._t0 -= 4.0  # pretend 4 s passed for 2 steps -> 2 s/step, 8 steps left
    p.update(2, {})
    assert p.eta_seconds() == pytest.approx(16.0, abs=0.5)


# ---------------------------------------------------------------- pass@k

def test_pass_at_k_hand_values():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the plain pass rate
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    # n=4, c=1, k=3: 1 - C(3,3)/C(4,3) = 1 - 1/4
    assert pass_at_k(4, 1, 3) == pytest.approx(0.75)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 2, 3) == 1.0  # n-c < k
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_eval_metrics_hand_values():
    rewards = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.9]]
    m = eval_metrics("addition", rewards, k=2)
    # mean reward over 12 samples: (2 + 0 + 3.9) / 12
    assert m["eval/addition"] == pytest.approx(5.9 / 12)
    # pass@2: prompt0 c=2 -> 1 - C(2,2)/C(4,2) = 5/6; prompt1 0; prompt2 c=4 (0.9 >= 0.5) -> 1
    assert m["eval/addition-pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3)
    assert set(m) == {"eval/addition", "eval/addition-pass@2"}
    # below threshold does not pass
    assert eval_metrics("x", [[0.4, 0.4]], k=1)["eval/x-pass@1"] == 0.0
    with pytest.raises(ValueError, match="prompt 0 has 1 samples < k=2"):
        eval_metrics("x", [[1.0]], k=2)

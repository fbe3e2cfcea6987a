"""The rollout store: Parquet rows per sample, readable by pyarrow and pandas, crash-safe, bounded; and a real
training run writing it."""
import asyncio
import json

import pyarrow.dataset as ds
import pytest

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.observe.store import RolloutStore, StoreMissingError, read_rollouts, stored_steps, store_step
from slick.types import Sample, Status


def make_samples(n=4, group=2, step=1):
    out = []
    for i in range(n):
        s = Sample(index=10 * step + i, group_index=i // group, prompt_index=i // group, epoch=0,
                   prompt=f"what is {i}+1?", label=str(i + 1), metadata={"rm_type": "exact", "reward_error": "x"},
                   prompt_ids=[5, 6, 7], response_ids=[100 + i, 101, 102], response=f"answer {i + 1}",
                   rollout_logprobs=[-0.5, -1.25, -2.0], loss_mask=[1, 0, 1], reward={"reward": float(i % 2), "acc": 1},
                   status=Status.COMPLETED if i else Status.TRUNCATED, weight_versions=[3, 3, 4],
                   timings={"reward_time": 0.25})
        out.append(s)
    return out


class OneCharTokenizer:
    def decode(self, ids):
        return "".join(chr(65 + (t % 26)) for t in ids)


def test_rows_round_trip_through_pyarrow_and_pandas(tmp_path):
    store = RolloutStore(tmp_path, tokenizer=OneCharTokenizer())
    samples = make_samples(step=3)
    path = store.write(3, samples, [0.0, 1.0, 0.0, 1.0], train_versions=[4, 4, 5, 5])
    assert path == tmp_path / "rollouts" / "step_00000003.parquet"
    table = ds.dataset(tmp_path / "rollouts").to_table()
    assert table.num_rows == 4
    df = read_rollouts(tmp_path)
    assert list(df["index"]) == [30, 31, 32, 33]
    assert list(df["step"]) == [3] * 4
    assert list(df["group_index"]) == [0, 0, 1, 1]
    assert list(df["reward"]) == [0.0, 1.0, 0.0, 1.0]
    assert json.loads(df["reward_raw"][1]) == {"reward": 1.0, "acc": 1}
    assert list(df["response_ids"][2]) == [102, 101, 102]
    assert list(df["response_tokens"][2]) == ["Y", "X", "Y"]
    assert list(df["loss_mask"][0]) == [1, 0, 1]
    assert list(df["rollout_logprobs"][0]) == [-0.5, -1.25, -2.0]
    assert list(df["weight_versions"][0]) == [3, 3, 4]
    assert list(df["train_version"]) == [4, 4, 5, 5]
    assert list(df["staleness"]) == [1, 1, 2, 2]          # train version - oldest token's version
    assert list(df["status"]) == ["truncated", "completed", "completed", "completed"]
    assert json.loads(df["label"][0]) == "1"
    assert json.loads(df["metadata"][0]) == {"rm_type": "exact"}   # the error is its own column
    assert list(df["reward_error"]) == ["x"] * 4
    assert json.loads(df["timings"][0]) == {"reward_time": 0.25}
    assert list(df["response_length"]) == [3] * 4
    assert df["evidence"].isna().all()                    # samples without evidence


def test_evidence_columns(tmp_path):
    samples = make_samples(2)
    for s in samples:
        s.evidence = {"reward_type": "math", "answer": "42", "verdict": "correct", "seconds": 0.01}
    RolloutStore(tmp_path).write(1, samples, [1.0, 1.0])
    df = read_rollouts(tmp_path)
    assert list(df["verdict"]) == ["correct", "correct"] and list(df["answer"]) == ["42", "42"]
    assert json.loads(df["evidence"][0])["reward_type"] == "math"
    assert df["response_tokens"].isna().all()            # no tokenizer given


def test_interval_and_hook(tmp_path):
    store = RolloutStore(tmp_path, interval=2)
    for step in (1, 2, 3, 4):
        m = store_step(store, step, make_samples(step=step), [0.5] * 4)
        assert ("perf/rollout_store_time" in m) == (step % 2 == 0)
    assert stored_steps(tmp_path) == [2, 4]
    assert store_step(None, 2, make_samples(), [0.0] * 4) == {}


def test_size_bound_drops_oldest_files(tmp_path, caplog):
    store = RolloutStore(tmp_path)
    store.write(1, make_samples(), [0.0] * 4)
    one = (tmp_path / "rollouts" / "step_00000001.parquet").stat().st_size
    store.max_bytes = int(one * 2.5)                       # room for two files
    for step in (2, 3, 4):
        store.write(step, make_samples(step=step), [0.0] * 4)
    assert stored_steps(tmp_path) == [3, 4]
    assert sum("deleting its oldest step files" in r.message for r in caplog.records) == 1


def test_crash_leftovers_are_invisible_and_cleaned(tmp_path):
    d = tmp_path / "rollouts"
    d.mkdir()
    (d / ".step_00000001.parquet.123.tmp").write_bytes(b"PAR1 half a file")
    assert ds.dataset(d).count_rows() == 0                 # a reader skips the hidden temp file
    RolloutStore(tmp_path).write(2, make_samples(), [1.0] * 4)
    assert sorted(p.name for p in d.iterdir()) == ["step_00000002.parquet"]


def test_missing_and_empty_store_errors(tmp_path):
    with pytest.raises(StoreMissingError, match="no rollout store here"):
        read_rollouts(tmp_path)
    (tmp_path / "rollouts").mkdir()
    with pytest.raises(StoreMissingError, match="empty"):
        read_rollouts(tmp_path)
    with pytest.raises(StoreMissingError, match="no such run directory"):
        read_rollouts(tmp_path / "nope")


@pytest.mark.parametrize("flags, problem", [({"rollout_store_interval": -1}, "--rollout-store-interval"),
                                            ({"rollout_store_max_mb": -5.0}, "--rollout-store-max-mb")])
def test_bad_flags_are_refused(flags, problem):
    with pytest.raises(ConfigError, match=problem):
        validate_config(Config.from_flat(flags), check_files=False)


def test_from_config_off_switches(tmp_path):
    assert RolloutStore.from_config(Config.from_flat({"no_rollout_store": True}), tmp_path) is None
    assert RolloutStore.from_config(Config.from_flat({"rollout_store_interval": 0}), tmp_path) is None
    assert not (tmp_path / "rollouts").exists()


def test_training_run_writes_the_store(tiny_model_dir, tmp_path):
    """slick train on a tiny random model: every step's trained samples are in the store, tokens and versions
    match what the engine produced, and the metrics carry perf/rollout_store_time."""
    from slick.loop.sync import train

    rows = [{"prompt": f"question {i}: say something", "label": "x"} for i in range(4)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), prompt_data=str(tmp_path / "p.jsonl"), rollout_batch_size=2,
        n_samples_per_prompt=2, rollout_max_response_len=6, rm_type="exact", lr=1e-3, num_rollout=2, dtype="fp32",
        run_dir=str(tmp_path / "run"), no_progress=True, seed=3, micro_batch_size=4,
        save_debug_rollout_data=str(tmp_path / "dbg"))))
    asyncio.run(train(cfg))
    assert stored_steps(tmp_path / "run") == [1, 2]
    df = read_rollouts(tmp_path / "run")
    assert len(df) == 8 and list(df["step"]) == [1] * 4 + [2] * 4
    assert list(df["train_version"]) == [0] * 4 + [1] * 4
    assert list(df["staleness"]) == [0] * 8                # synchronous: trained by the weights that sampled
    for step in (0, 1):                                    # the debug dump of the same samples (0-based names)
        saved = [json.loads(line) for line in (tmp_path / "dbg" / f"rollout_{step}.jsonl").read_text().splitlines()]
        got = df[df["step"] == step + 1]
        assert list(got["index"]) == [s["index"] for s in saved]
        assert [list(x) for x in got["response_ids"]] == [s["response_ids"] for s in saved]
        assert [list(x) for x in got["weight_versions"]] == [s["weight_versions"] for s in saved]
        assert list(got["response"]) == [s["response"] for s in saved]
        assert all(len(t) == len(i) for t, i in zip(got["response_tokens"], got["response_ids"]))
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["perf/rollout_store_time"] >= 0 for m in metrics)


def test_async_run_stores_staleness(tiny_model_dir, tmp_path):
    """slick train-async with --max-staleness 1: the store's train_version and staleness are the ones the
    trainer used (the --save-debug-train-data dump of the same samples) and match rollout/staleness/max."""
    from slick.loop.train_async import train_async

    rows = [{"prompt": f"question {i}: say something", "label": "x"} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), prompt_data=str(tmp_path / "p.jsonl"), rollout_batch_size=2,
        n_samples_per_prompt=2, rollout_max_response_len=6, rm_type="exact", lr=1e-3, num_rollout=3, dtype="fp32",
        run_dir=str(tmp_path / "run"), no_progress=True, seed=3, micro_batch_size=4, max_staleness=1, use_tis=True,
        save_debug_train_data=str(tmp_path / "dbg"))), driver="async")
    asyncio.run(train_async(cfg))
    df = read_rollouts(tmp_path / "run")
    assert list(df["step"]) == [1] * 4 + [2] * 4 + [3] * 4
    for step in (0, 1, 2):
        dump = [json.loads(line) for line in (tmp_path / "dbg" / f"train_{step}.jsonl").read_text().splitlines()]
        got = df[df["step"] == step + 1]
        assert list(got["index"]) == [d["index"] for d in dump]
        assert list(got["train_version"]) == [d["train_version"] for d in dump]
        assert list(got["staleness"]) == [d["train_version"] - min(d["weight_versions"]) for d in dump]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout/staleness/max"] for m in metrics] == [int(df[df["step"] == s]["staleness"].max())
                                                             for s in (1, 2, 3)] == [0, 1, 1]

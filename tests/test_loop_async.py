"""slick train-async end to end with a tiny random model: staleness bound, N = 0 equals slick train,
eval beside the producer, exactly-once resume after SIGKILL, and the start-up checks."""
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.loop.sync import train
from slick.loop.train_async import train_async
from tests.test_loop import make_cfg, prompts, read_jsonl  # noqa: F401 - prompts is a fixture

ROOT = Path(__file__).resolve().parents[1]


def make_async_cfg(model_dir, prompts, run_dir, **over):
    values = dict(hf_checkpoint=str(model_dir), prompt_data=str(prompts), rollout_batch_size=2,
                  n_samples_per_prompt=4, rollout_max_response_len=8, custom_rm_path="even_rm.even_tokens",
                  lr=1e-3, num_rollout=6, dtype="fp32", run_dir=str(run_dir), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, use_tis=True)
    values.update(over)
    return validate_config(Config.from_flat(values), driver="async")


def train_rows(directory: Path) -> dict[int, list[dict]]:
    return {int(p.stem.split("_")[1]): read_jsonl(p) for p in sorted(directory.glob("train_*.jsonl"))}


@pytest.mark.parametrize("n,mode", [(0, "wait"), (1, "wait"), (2, "continue"), (2, "resubmit")])
def test_every_trained_sample_respects_the_staleness_bound(tiny_model_dir, prompts, tmp_path, n, mode):
    dbg = tmp_path / "dbg"
    cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=n, async_weight_update=mode,
                         rollout_max_response_len=24, save_debug_train_data=str(dbg))
    run = asyncio.run(train_async(cfg))
    steps = train_rows(dbg)
    assert sorted(steps) == list(range(6))
    lags = [r["train_version"] - min(r["weight_versions"]) for rows in steps.values() for r in rows]
    assert len(lags) == 6 * 8 and max(lags) <= n
    # the producer runs ahead as far as it may: from step n on, the batch is exactly n versions old
    assert [steps[s][0]["train_version"] - min(steps[s][0]["weight_versions"]) for s in range(6)] == \
        [min(s, n) for s in range(6)]
    # one epoch of 12 prompts, each trained once, in the DataSource's order
    assert [r["prompt_index"] for s in range(6) for r in steps[s][::4]] == list(range(12))
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["rollout/staleness/max"] for m in metrics] == [min(s, n) for s in range(6)]
    assert all(m["buffer/dropped_stale_groups"] == 0 for m in metrics)
    assert run.train_parts.trainer.version == 6


def test_max_staleness_0_gives_the_batches_of_slick_train(tiny_model_dir, prompts, tmp_path):
    sync_cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "sync", num_rollout=4, rollout_shuffle=True,
                        save_debug_train_data=str(tmp_path / "dbg_sync"))
    async_cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "async", num_rollout=4, rollout_shuffle=True,
                               use_tis=False, max_staleness=0, save_debug_train_data=str(tmp_path / "dbg_async"))
    asyncio.run(train(sync_cfg))
    asyncio.run(train_async(async_cfg))
    a, b = train_rows(tmp_path / "dbg_sync"), train_rows(tmp_path / "dbg_async")
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for step in a:
        key = ("index", "group_index", "prompt_index", "epoch", "response_ids", "weight_versions", "train_version")
        assert [[r[k] for k in key] for r in a[step]] == [[r[k] for k in key] for r in b[step]], step
        for ra, rb in zip(a[step], b[step]):
            assert ra["rollout_logprobs"] == pytest.approx(rb["rollout_logprobs"], abs=1e-5)
            assert ra["reward"] == rb["reward"]


def test_eval_beside_the_producer_scores_every_sample(tiny_model_dir, prompts, tmp_path):
    cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=1, num_rollout=3,
                         eval_prompt_data=["held", str(prompts)], eval_interval=1, n_samples_per_eval_prompt=2)
    asyncio.run(train_async(cfg))
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    evals = [m for m in metrics if "eval/held" in m]
    assert [m["step"] for m in evals] == [0, 1, 2, 3]
    # every eval sample finished and was scored: 12 prompts x 2 samples of 8 tokens, no reward failure
    assert all(m["eval/held/response_len"] == 8.0 for m in evals)
    assert all(m.get("reward/failures", 0.0) == 0.0 for m in metrics)


def _cmd(model, prompts, run_dir, dbg, ckpt, *extra):
    return [sys.executable, "-m", "slick.cli", "train-async", "--hf-checkpoint", str(model),
            "--prompt-data", str(prompts), "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
            "--rollout-max-response-len", "24", "--custom-rm-path", "even_rm.even_tokens", "--lr", "1e-3",
            "--dtype", "fp32", "--run-dir", str(run_dir), "--no-progress", "--max-staleness", "2", "--use-tis",
            "--rollout-shuffle", "--save-debug-train-data", str(dbg), "--save", str(ckpt), "--save-interval", "1",
            "--num-epoch", "2", *extra]


@pytest.mark.slow
def test_sigkill_and_resume_trains_every_prompt_exactly_once(tiny_model_dir, prompts, tmp_path):
    """A real driver process killed with SIGKILL after its 3rd checkpoint, resumed with --load: over the two
    epochs every prompt is trained exactly twice (once per epoch), none lost, none repeated."""
    dbg, ckpt = tmp_path / "dbg", tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": f"{prompts.parent}{os.pathsep}{ROOT}"}
    proc = subprocess.Popen(_cmd(tiny_model_dir, prompts, tmp_path / "run", dbg, ckpt), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (ckpt / "step_000003").is_dir():       # kill as soon as the 3rd checkpoint is complete
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no 3rd checkpoint within 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    r = subprocess.run(_cmd(tiny_model_dir, prompts, tmp_path / "run", dbg, ckpt, "--load", str(ckpt)), cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = train_rows(dbg)
    assert sorted(steps) == list(range(12))
    seen = collections.Counter((r["epoch"], r["prompt_index"]) for rows in steps.values() for r in rows[::4])
    assert seen == collections.Counter({(e, i): 1 for e in (0, 1) for i in range(12)})
    assert all(len(rows) == 8 for rows in steps.values())


def test_async_start_up_checks_name_the_numbers(tiny_model_dir, prompts, tmp_path):
    def problems(**over):
        with pytest.raises(ConfigError) as e:
            make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", **over)
        return str(e.value)

    assert "add --use-tis" in problems(max_staleness=1, use_tis=False)
    assert "--max-staleness 0 cannot be met with 2 optimizer steps per rollout" in \
        problems(max_staleness=0, num_steps_per_rollout=2)
    assert "use --max-staleness >= 2" in problems(max_staleness=1, update_weights_interval=3)
    assert "--partial-rollout is not supported by slick train-async" in problems(partial_rollout=True)
    with pytest.raises(ConfigError, match="--async-buffer-size is for slick train-async only"):
        make_cfg(tiny_model_dir, prompts, tmp_path / "run", async_buffer_size=2)
    with pytest.raises(ConfigError, match="--async-weight-update is for slick train-async only"):
        make_cfg(tiny_model_dir, prompts, tmp_path / "run", async_weight_update="continue")
    # N = 1 with one optimizer step per rollout and TIS is fine
    make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=1)


@pytest.mark.parametrize("threads", [None, 1])
def test_shared_cores_let_the_generation_finish_before_each_step(tiny_model_dir, prompts, tmp_path, threads):
    """On a CPU with no thread flag the trainer and the engine share the cores: each step waits for the engine's
    requests in flight (perf/trainer_yield_time); with --train-num-threads the cores are split and it does not."""
    cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=1, num_rollout=3,
                         train_num_threads=threads)
    asyncio.run(train_async(cfg))
    metrics = [m for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "perf/step_time" in m]
    assert len(metrics) == 3
    yields = [m.get("perf/trainer_yield_time") for m in metrics]
    if threads is None:
        assert all(y is not None and 0.02 <= y < m["perf/step_time"] for y, m in zip(yields, metrics))
    else:
        assert yields == [None] * 3

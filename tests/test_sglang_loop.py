"""`slick train --rollout-engine sglang` with real SGLang servers slick launches on this CPU: every sync lands and
is verified on every server, train-async keeps each token's version with each --async-weight-update mode, a
server killed (SIGKILL) or hung (SIGSTOP) mid-rollout is healed with every prompt trained once, and a killed
driver leaves no SGLang process. .venv-sglang comes from `make sglang` (CI sets SLICK_REQUIRE_SGLANG=1)."""
import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from slick.types import Sample, SamplingParams
from tests.test_fault_engine import _assert_each_prompt_once, _prompts, _steps
from tests.test_loop import make_cfg, read_jsonl
from tests.test_sglang_engine import need_sglang, sglang_model_dir  # noqa: F401  (fixture)
from tests.test_vllm_loop import train_async_keeps_versions_per_token

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sglang_procs(root=None) -> list:
    me = psutil.Process(root) if root else psutil.Process()
    return [p for p in me.children(recursive=True) if "sglang" in " ".join(p.cmdline())]


def test_train_with_sglang_behind_the_router_syncs_every_step(sglang_model_dir, tmp_path):  # noqa: F811
    need_sglang()
    from slick.loop.sync import train

    prompts = _prompts(tmp_path, 6)
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = make_cfg(sglang_model_dir, prompts, tmp_path / "run", num_rollout=3, rollout_engine="sglang",
                       router="sglang", save_debug_train_data=str(tmp_path / "dbg"), mismatch_probe_interval=1)
        run = asyncio.run(train(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and run.train_parts.trainer.version == 3
    # every step's rollout logprobs (steps 2, 3 sampled after a sync) equal the trainer's own in fp32, over the
    # sampled tokens and over the whole next-token distribution (top-20 + rest)
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] < 2e-4, r
        assert r["train/train_rollout_logprob_abs_diff_max"] < 2e-3 and r["train/train_rollout_logprob_gap_frac"] == 0
        assert 0 <= r["train/mismatch_kl_mean"] <= r["train/mismatch_kl_max"] < 1e-5, r
    seen = []
    for step in (0, 1, 2):
        samples = read_jsonl(tmp_path / "dbg" / f"train_{step}.jsonl")
        seen += sorted({s["prompt_index"] for s in samples})
        assert {v for s in samples for v in s["weight_versions"]} == {step}
    assert sorted(seen) == [0, 1, 2, 3, 4, 5]
    assert _sglang_procs() == []    # the run stopped its servers and the router


@pytest.mark.parametrize("mode", ["continue", "resubmit"])
def test_train_async_with_sglang_keeps_versions_per_token(sglang_model_dir, tmp_path, mode):  # noqa: F811
    """train-async against real SGLang servers with the --async-weight-update modes that act on requests in flight
    (pause_generation in place, or abort + resubmit): every token's version stays within the staleness bound.
    (``wait`` drives SGLang as `slick train` does, test_train_with_sglang_behind_the_router_syncs_every_step; it
    passed here, 88 s, and is left out of the suite for time.)"""
    need_sglang()
    train_async_keeps_versions_per_token(sglang_model_dir, tmp_path, "sglang", mode)
    assert _sglang_procs() == []


async def _when_serving(engine, url, timeout=120):
    deadline = time.monotonic() + timeout
    while url not in engine.inflight().values():
        assert time.monotonic() < deadline, f"no request reached {url}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_a_killed_or_hung_sglang_server_mid_rollout_is_replaced(sglang_model_dir, tmp_path, sig):  # noqa: F811
    need_sglang()
    from slick.engines.sglang_client import SglangEngine
    from slick.loop.run import Run

    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(sglang_model_dir, _prompts(tmp_path, 6), tmp_path / "run", num_rollout=3, rollout_engine="sglang",
                   rollout_num_workers=2, use_fault_tolerance=True, n_samples_per_prompt=2,
                   rollout_max_response_len=200, rollout_health_check_interval=1.0,
                   rollout_health_check_timeout=10.0)
    killed = {}

    async def kill_first(run):
        victim = run.rollout_parts.engines.recovery.workers[run.rollout_parts.engines.worker_urls[0]]
        await _when_serving(run.rollout_parts.engines.engine, victim.url)
        killed.update(url=victim.url, pid=victim.pid)
        os.kill(victim.pid, sig)

    run = Run(cfg)

    async def go():
        try:
            steps = await _steps(run, kill_first)
            eng = run.rollout_parts.engines.engine
            (new,) = set(eng.control_urls) - set(run.rollout_parts.engines.worker_urls)
            version = await eng.weight_version_of(new)
            one = SglangEngine([new], api_key=eng.api_key)
            gen = await one.generate([1, 2, 3, 4, 5, 6], SamplingParams(temperature=1.0, max_new_tokens=8))
            await one.close()
            return steps, new, version, gen
        finally:
            await run.close()

    try:
        steps, new, version, gen = asyncio.run(go())
        rec = run.rollout_parts.engines.recovery
        assert (rec.deaths, rec.restarts, rec.errors) == (1, 1, [])
        assert rec.events[0][1] == killed["url"]
        assert run.rollout_parts.engines.engine.resubmitted >= 1
        assert new != killed["url"] and version == run.train_parts.trainer.version == 3
        s = Sample(prompt_ids=[1, 2, 3, 4, 5, 6], response_ids=gen.token_ids, loss_mask=[1] * 8)
        ref = run.train_parts.trainer.compute_logprobs([s], "actor")[0].tolist()
        assert max(abs(x - y) for x, y in zip(ref, gen.logprobs)) < 2e-4   # the replacement has the trainer's weights
    finally:
        sys.path.remove(str(tmp_path))
        if sig == signal.SIGSTOP and psutil.pid_exists(killed.get("pid", -1)):
            os.kill(killed["pid"], signal.SIGCONT)
    _assert_each_prompt_once(steps, 6, 2)
    assert _sglang_procs() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_or_killed_driver_leaves_no_sglang_process(sglang_model_dir, tmp_path, sig):  # noqa: F811
    need_sglang()
    prompts = _prompts(tmp_path, 6)
    cmd = [sys.executable, "-m", "slick.cli", "train", "--hf-checkpoint", str(sglang_model_dir), "--prompt-data",
           str(prompts), "--rollout-engine", "sglang", "--custom-rm-path", "even_rm.even_tokens", "--num-rollout",
           "1000", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
           "--dtype", "fp32", "--run-dir", str(tmp_path / "run"), "--no-progress"]
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    kids = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            metrics = tmp_path / "run" / "metrics.jsonl"
            if metrics.is_file() and metrics.read_text().strip():
                break
            time.sleep(0.5)
        kids = _sglang_procs(proc.pid)
        assert len(kids) >= 3, [p.cmdline()[:4] for p in kids]    # the server, its scheduler and detokenizer
        proc.send_signal(sig)
        proc.wait(timeout=60)
        gone_by = time.monotonic() + 60
        while [p for p in kids if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] and time.monotonic() < gone_by:
            time.sleep(0.5)
        left = [p for p in kids if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [p.cmdline()[:4] for p in left]
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in kids:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        log.close()

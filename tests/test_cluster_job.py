"""`ray job submit --address http://127.0.0.1:<dashboard> -- slick train ...` against a real Ray head that the
test starts (tests/ray_head.py) and stops; the job's process finds the cluster through RAY_ADDRESS, which Ray
sets for it."""
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.ray_head import RayHead

RAY = str(Path(sys.executable).with_name("ray"))
SLICK = str(Path(sys.executable).with_name("slick"))
JOB_TIMEOUT_S = 420


@pytest.fixture(scope="module")
def head():
    with RayHead(num_cpus=4) as h:
        yield h


def _prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i} + 1 =", "label": str(i + 1)}) + "\n" for i in range(8)))
    return path


def submit(head, tmp_path, model_dir, extra=()):
    """Submit a 2-step `slick train` of the tiny model; wait (bounded) for it; return (job id, run dir, logs)."""
    run_dir = tmp_path / "run"
    job_id = f"slick-test-{uuid.uuid4().hex[:8]}"
    root = str(Path(__file__).resolve().parent.parent)      # so the job can import tests.* plug-ins
    cmd = [RAY, "job", "submit", "--address", head.dashboard_url, "--submission-id", job_id,
           "--runtime-env-json", json.dumps({"env_vars": {"PYTHONPATH": root}}), "--",
           SLICK, "train", "--hf-checkpoint", str(model_dir), "--prompt-data", str(_prompts(tmp_path)),
           "--rm-type", "math", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
           "--rollout-max-response-len", "4", "--micro-batch-size", "4", "--num-rollout", "2", "--dtype", "fp32",
           "--lr", "1e-3", "--run-dir", str(run_dir), "--no-progress", *extra]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=head.client_env(), timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        subprocess.run([RAY, "job", "stop", "--address", head.dashboard_url, job_id], env=head.client_env(),
                       capture_output=True, timeout=60)
        raise AssertionError(f"ray job {job_id} did not finish within {JOB_TIMEOUT_S}s; output so far:\n"
                             f"{(e.stdout or b'')[-3000:]}") from e
    logs = r.stdout + r.stderr
    assert r.returncode == 0, f"ray job submit exited {r.returncode}:\n{logs[-4000:]}"
    status = head.job_client().get_job_status(job_id)
    assert str(status) in ("SUCCEEDED", "JobStatus.SUCCEEDED"), f"ray job {job_id}: {status}\n{logs[-3000:]}"
    return job_id, run_dir, logs


def _steps(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows


@pytest.mark.slow
def test_ray_job_submit_one_process_run(head, tmp_path, tiny_model_dir):
    """One process: the job's driver runs the whole loop; RAY_ADDRESS points at the head that runs it."""
    job_id, run_dir, logs = submit(head, tmp_path, tiny_model_dir,
                                   ["--custom-rm-path", "tests.test_cluster_job:env_reward"])
    rows = _steps(run_dir)
    assert [r["step"] for r in rows] == [1, 2], logs[-3000:]
    assert all(r["train/loss"] == r["train/loss"] for r in rows)          # finite, not NaN
    # the reward saw the job's environment: RAY_ADDRESS is the head's GCS (port), as Ray sets it for a job
    assert {r["rollout/raw_reward"] for r in rows} == {float(head.ports["--port"])}


def env_reward(args, sample):
    """Reward = the port of the RAY_ADDRESS the job's process was given (proves which cluster it ran under)."""
    import os

    return float(os.environ["RAY_ADDRESS"].rsplit(":", 1)[1])

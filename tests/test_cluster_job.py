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
JOB_TIMEOUT_S = 600


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


def _actors(head) -> list:
    """Every actor this head's cluster has seen (the dashboard's state API), as dicts."""
    import urllib.request

    req = urllib.request.Request(f"{head.dashboard_url}/api/v0/actors?limit=1000&detail=1",
                                 headers={"Authorization": f"Bearer {head.token}"} if head.token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = json.loads(r.read())
    return body["data"]["result"]["result"]


@pytest.mark.slow
def test_ray_job_submit_two_trainer_ranks_join_the_submitted_cluster(head, tmp_path, tiny_model_dir):
    """Two trainer ranks: the job's driver joins the head through RAY_ADDRESS (no cluster of its own) and the
    rank actors run there."""
    before = {a["actor_id"] for a in _actors(head)}
    job_id, run_dir, logs = submit(head, tmp_path, tiny_model_dir, ["--actor-num-gpus-per-node", "2"])
    rows = _steps(run_dir)
    assert [r["step"] for r in rows] == [1, 2], logs[-3000:]
    assert all(r["train/loss"] == r["train/loss"] for r in rows)
    ranks = [a for a in _actors(head) if a["actor_id"] not in before and a["class_name"] == "TrainerRank"]
    assert len(ranks) == 2, [(a["class_name"], a["state"]) for a in _actors(head)]
    assert {a["state"] for a in ranks} == {"DEAD"}          # the run ended them


def test_job_runtime_env_keys_win_over_the_ones_slick_adds(monkeypatch):
    """Under `ray job submit --runtime-env-json '{"env_vars": {...}}'` Ray refuses a ray.init runtime env that sets
    the same keys; slick drops its own value of those keys (the job's wins) and keeps the others."""
    from slick.cluster.ray_cluster import without_job_env_keys

    env = {"PYTHONPATH": "/slick", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert without_job_env_keys(env) == env
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR",
                       json.dumps({"runtime_env": {"env_vars": {"PYTHONPATH": "/user", "OTHER": "x"}}}))
    assert without_job_env_keys(env) == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": None}))
    assert without_job_env_keys(env) == env

"""`slick inspect`: the real server as a subprocess on 127.0.0.1, its JSON API over real HTTP, on a run that
grows while it is served."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager

import pytest

from tests.rollout_data import make_run


@contextmanager
def inspector(run_dir, timeout=60.0):
    """Start `slick inspect RUN_DIR --port 0`; yield its base URL; stop it (SIGTERM, then kill)."""
    proc = subprocess.Popen([sys.executable, "-m", "slick.cli", "inspect", str(run_dir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    try:
        if not lines or "http://" not in lines[0]:
            proc.kill()
            raise TimeoutError(f"slick inspect did not print its URL within {timeout}s "
                               f"(stdout {lines}, stderr {proc.stderr.read()[-2000:]!r})")
        url = lines[0].split("at ", 1)[1].split()[0].rstrip("/")
        assert url.startswith("http://127.0.0.1:")
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        proc.stdout.close()
        proc.stderr.close()


def get(url, expect=200):
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            status, body, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, body, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    assert status == expect, (url, status, body[:300])
    return json.loads(body) if "json" in ctype else body.decode()


@pytest.fixture()
def run_dir(tmp_path):
    make_run(tmp_path)
    return tmp_path


def test_api_serves_curves_distributions_samples_and_tokens(run_dir):
    with inspector(run_dir) as url:
        page = get(url + "/")
        assert "<title>slick inspect</title>" in page and 'src="app.js"' in page
        assert "http" not in page.replace("http-equiv", "").replace("http://www.w3.org", "")  # no external fetch
        assert "function lineChart" in get(url + "/app.js")

        info = get(url + "/api/run")
        assert info["stored_steps"] == [1, 2] and info["name"] == run_dir.name and info["store_message"] is None

        m = get(url + "/api/metrics")
        assert [r["step"] for r in m["rows"]] == [1, 2]
        assert m["rows"][0]["rollout/raw_reward"] == 0.75 and m["rows"][1]["train/loss"] == 0.25
        assert "rollout/staleness/mean" in m["keys"]

        steps = get(url + "/api/steps")["steps"]
        assert [s["step"] for s in steps] == [1, 2] and [s["n"] for s in steps] == [8, 8]
        assert steps[0]["reward_mean"] == 0.75 and steps[0]["reward_min"] == 0.0 and steps[0]["reward_max"] == 1.0
        assert steps[0]["reward_hist"] == [2] + [0] * 8 + [6]
        assert sum(steps[1]["len_hist"]) == 8 and steps[1]["len_max"] == len("the answer is 18")
        assert steps[0]["staleness_mean"] == 1.0 and steps[1]["staleness_max"] == 1   # version 1 vs weights 0

        best = get(url + "/api/samples?step=2&order=best&limit=3")
        assert [s["index"] for s in best["samples"]] == [8, 9, 10]         # reward 1, then shortest, then index
        worst = get(url + "/api/samples?order=worst&limit=2")               # default: the latest step
        assert worst["step"] == 2 and [(s["index"], s["reward"]) for s in worst["samples"]] == [(11, 0.0), (15, 0.0)]
        assert worst["samples"][0]["prompt"] == "What is 3 + 12?" and worst["samples"][0]["label"] == "15"

        one = get(url + "/api/sample?step=2&index=13")
        assert one["response"] == "the answer is 18"
        toks = one["tokens"]
        assert "".join(t["text"] for t in toks) == "the answer is 18"
        assert [t["mask"] for t in toks[:6]] == [1, 1, 0, 0, 0, 1]
        assert toks[1] == {"pos": 1, "id": ord("h"), "text": "h", "mask": 1, "logprob": pytest.approx(-0.1),
                           "version": 1}

        assert "not in stored step 2" in get(url + "/api/sample?step=2&index=99", 404)["error"]
        assert "must be an integer" in get(url + "/api/sample?step=x&index=1", 400)["error"]
        assert "is required" in get(url + "/api/sample?step=2", 400)["error"]
        assert "step 7 is not in the rollout store" in get(url + "/api/samples?step=7", 404)["error"]
        assert "order must be" in get(url + "/api/samples?order=middle", 400)["error"]


def test_a_running_run_is_read_again_on_each_request(tmp_path):
    (tmp_path / "config.yaml").write_text("reward: {rm_type: gsm8k}\n")
    with inspector(tmp_path) as url:
        info = get(url + "/api/run")
        assert info["stored_steps"] == [] and "no rollout store here" in info["store_message"]
        assert info["verifier"] == "gsm8k"
        assert get(url + "/api/metrics")["rows"] == []
        assert get(url + "/api/steps")["steps"] == []
        assert get(url + "/api/samples")["samples"] == []
        make_run(tmp_path, steps=(1,))
        with open(tmp_path / "metrics.jsonl", "a") as f:
            f.write('{"step": 2, "time": 1.0, "rollout/raw_')          # a line being written right now
        time.sleep(0.01)
        assert get(url + "/api/run")["stored_steps"] == [1]
        assert [r["step"] for r in get(url + "/api/metrics")["rows"]] == [1]
        make_run(tmp_path, steps=(2,))
        assert [s["step"] for s in get(url + "/api/steps")["steps"]] == [1, 2]


def test_bad_run_dir_and_busy_port(tmp_path):
    out = subprocess.run([sys.executable, "-m", "slick.cli", "inspect", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no such run directory" in out.stderr
    with inspector(tmp_path) as url:
        port = url.rsplit(":", 1)[1]
        out = subprocess.run([sys.executable, "-m", "slick.cli", "inspect", str(tmp_path), "--port", port],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in out.stderr

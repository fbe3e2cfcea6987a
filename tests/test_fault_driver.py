"""A driver that dies leaves nothing behind and loses nothing.

* SIGTERM of `slick train --rollout-engine http` shuts down like Ctrl-C; after SIGKILL the `slick serve`
  workers and the sglang-router notice their parent is gone and exit, freeing their ports.
* A driver killed with SIGKILL at a random (seeded) moment, resumed with --load, trains every prompt of each
  epoch exactly once (slick train and slick train-async).
* A synchronous reward function that never returns does not keep a finished run alive.
"""
import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slick.engines.router import router_available
from slick.ckpt import checkpoint as ckpt
from slick.proc.memory import find_tcmalloc
from tests import test_loop

ROOT = Path(__file__).resolve().parents[1]
prompts = test_loop.prompts   # the fixture: 12 prompts + even_rm.py beside them


def _env(prompts):
    return {**os.environ, "PYTHONPATH": f"{prompts.parent}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


def _base(cmd, model, prompts, run_dir, *extra):
    return [sys.executable, "-m", "slick.cli", cmd, "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
            "--custom-rm-path", "even_rm.even_tokens", "--lr", "1e-3", "--dtype", "fp32", "--run-dir", str(run_dir),
            "--no-progress", "--seed", "3", "--rollout-seed", "5", "--micro-batch-size", "4", *extra]


def _children(pid: int) -> dict[int, str]:
    """{pid: command line} of the live direct children of ``pid``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == pid:
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT connections do not hold the port
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _listening_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on (its socket inodes matched against /proc/net/tcp{,6} LISTEN rows)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _wait(cond, timeout: float, what: str, poll_s: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_driver_signal_leaves_no_worker_or_router(tiny_model_dir, prompts, tmp_path, sig):
    if not router_available():
        pytest.fail("sglang-router is not installed (pip install -e '.[all]')")
    cmd = _base("train", tiny_model_dir, prompts, tmp_path / "run", "--rollout-engine", "http",
                "--rollout-num-workers", "2", "--router", "sglang", "--num-rollout", "1000")
    log = open(tmp_path / "driver.log", "w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(prompts), stdout=log, stderr=subprocess.STDOUT)
    kids = {}
    try:
        def started():
            assert proc.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            k = _children(proc.pid)
            workers = [p for p, c in k.items() if " serve " in c]
            routers = [p for p, c in k.items() if "sglang" in c]   # the router renames itself sglang::router
            metrics = tmp_path / "run" / "metrics.jsonl"
            if len(workers) == 2 and len(routers) == 1 and metrics.is_file() and metrics.read_text().strip():
                return k
            return None
        kids = _wait(started, 240, "2 workers, the router and a first trained step")
        ports = [port for p in kids for port in _listening_ports(p)]
        assert len(ports) >= 4 and not any(_port_free(p) for p in ports), ports   # 2 workers, router + metrics
        assert sum("--parent-pid" in c for c in kids.values()) == 2, kids
        t0 = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=60)
        if sig == signal.SIGTERM:         # a clean shutdown: Run.close stopped them before the driver exited
            assert proc.returncode == 143, (tmp_path / "driver.log").read_text()[-3000:]
            assert not [p for p in kids if _alive(p)]
            assert "SIGTERM received; shutting down" in (tmp_path / "driver.log").read_text()
        else:
            assert proc.returncode == -signal.SIGKILL
        _wait(lambda: not [p for p in kids if _alive(p)], 30, f"workers/router {sorted(kids)} to exit")
        _wait(lambda: all(_port_free(p) for p in ports), 10, f"ports {ports} to be free")
        print(f"{sig.name}: children gone {time.monotonic() - t0:.1f}s after the signal")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for p in kids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        log.close()


STUCK_RM = '''
import threading

def stuck_once(args, sample):
    """Never returns for the first sample; a constant for the others."""
    if sample.index == 0:
        threading.Event().wait()
    return 1.0
'''


def test_a_reward_that_never_returns_does_not_keep_a_finished_run_alive(tiny_model_dir, prompts, tmp_path):
    (prompts.parent / "stuck_rm.py").write_text(STUCK_RM)
    cmd = _base("train", tiny_model_dir, prompts, tmp_path / "run", "--num-rollout", "2", "--rm-timeout", "2")
    cmd[cmd.index("even_rm.even_tokens")] = "stuck_rm.stuck_once"
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=_env(prompts), capture_output=True, text=True, timeout=300)
    total = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["reward/timeouts"] == 1.0         # the stuck call counted as failed after --rm-timeout
    assert "reward function stuck_rm.stuck_once is still running" in r.stderr, r.stderr[-3000:]
    # run as a program, `slick train` re-executed itself with tcmalloc where it is installed (CI installs it)
    want = "tcmalloc" if find_tcmalloc() else "glibc, tuned"
    assert f"CPU allocator: {want}\n" in r.stderr, r.stderr[-3000:]
    # the exit follows the end of the run at once (a thread pool that joins its threads would wait forever)
    ended = (tmp_path / "run" / "metrics.jsonl").stat().st_mtime
    assert time.time() - ended < 15, f"exited {time.time() - ended:.1f}s after the last step ({total:.0f}s in all)"


def _train_steps(directory: Path) -> dict[int, list[dict]]:
    out = {}
    for p in directory.glob("train_*.jsonl"):
        out[int(p.stem.split("_")[1])] = [json.loads(line) for line in p.read_text().splitlines()]
    return out


def _resumed_step(log_text: str) -> int:
    marker = " at step "
    lines = [line for line in log_text.splitlines() if "resumed from" in line and marker in line]
    assert len(lines) == 1, log_text[-3000:]
    return int(lines[0].rsplit(marker, 1)[1].split()[0])


def _kill_and_resume(cmd_name, model, prompts, tmp_path, seed, kills, extra):
    """Run the driver and SIGKILL it once per entry of ``kills`` ("random": a seeded random moment after a
    checkpoint newer than the one it started from; "mid-checkpoint": as soon as a checkpoint's temp directory
    appears), resuming with --load each time, until a process finishes. Returns per process (start step,
    debug train dir, return code, log path)."""
    rng = random.Random(seed)
    ckpt_dir = tmp_path / "ckpt"
    procs = []     # (start step, dbg dir, returncode)
    start = 0
    tmp_left, left_by_kill = [], []
    for i in range(len(kills) + 1):
        dbg = tmp_path / f"dbg{i}"
        cmd = _base(cmd_name, model, prompts, tmp_path / "run", "--save", str(ckpt_dir), "--save-interval", "1",
                    "--save-debug-train-data", str(dbg), "--num-epoch", "2", "--rollout-shuffle", *extra)
        if i:
            cmd += ["--load", str(ckpt_dir)]
        log_path = tmp_path / f"driver{i}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(prompts), stdout=log, stderr=subprocess.STDOUT)
            try:
                if i:
                    start = _wait(lambda: proc.poll() is not None or "resumed from" in log_path.read_text(), 240,
                                  "the resume") and _resumed_step(log_path.read_text())
                if i and tmp_left:   # the temp dir of the interrupted write was removed at start-up
                    assert f"removed {tmp_left[0]} left by an interrupted checkpoint write" in log_path.read_text()
                if i < len(kills) and kills[i] == "random":
                    def newer():
                        latest = ckpt_dir / "latest"
                        return proc.poll() is not None or (latest.is_file() and
                                                           int(latest.read_text() or 0) > start)
                    _wait(newer, 300, f"a checkpoint newer than step {start}")
                    time.sleep(rng.uniform(0.0, 5.0))
                elif i < len(kills):
                    def writing():
                        return proc.poll() is not None or [p for p in ckpt_dir.glob(".tmp-step_*")
                                                           if int(p.name.split("_")[1].split("-")[0]) > start + 1]
                    _wait(writing, 300, f"a checkpoint write after step {start + 1}", poll_s=0.01)
                if i < len(kills) and proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=60)
                    tmp_left = [str(p) for p in ckpt_dir.glob(".tmp-*")]
                    left_by_kill.append([Path(p).name for p in tmp_left])
                proc.wait(timeout=600)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=30)
        procs.append((start, dbg, proc.returncode, log_path))
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, log_path.read_text()[-3000:]
    assert procs[-1][2] == 0, procs[-1][3].read_text()[-3000:]
    print(f"{cmd_name}: kills {kills}; temp dirs left by each kill: {left_by_kill}")
    return procs


def _assert_exactly_once(procs, ckpt_dir, num_steps=12, prompts_per_epoch=12, n=4):
    """Every (epoch, prompt) trained exactly once, counting each process's steps from its start up to the step
    the next process resumed from (later steps of a killed process are re-done and do not count)."""
    seen = collections.Counter()
    covered = []
    for i, (start, dbg, _, _) in enumerate(procs):
        end = procs[i + 1][0] if i + 1 < len(procs) else num_steps
        steps = _train_steps(dbg)
        assert set(range(start, end)) <= set(steps), (i, start, end, sorted(steps))
        for s in range(start, end):
            rows = steps[s]
            assert len(rows) == 2 * n
            groups = {}
            for r in rows:
                groups.setdefault(r["group_index"], set()).add((r["epoch"], r["prompt_index"]))
            assert all(len(g) == 1 for g in groups.values())
            seen.update(next(iter(g)) for g in groups.values())
        covered.append((start, end))
    assert seen == collections.Counter({(e, p): 1 for e in (0, 1) for p in range(prompts_per_epoch)}), seen
    # the final checkpoint's data state has handed out every prompt of both epochs once, nothing pending
    step, d = ckpt.resolve_step_dir(ckpt_dir)
    data = json.loads((d / "state.json").read_text())["data"]
    assert step == num_steps and data["consumed"] == 2 * prompts_per_epoch and data["pending"] == []
    assert not [p.name for p in ckpt_dir.iterdir() if p.name.startswith(".")]
    return covered


@pytest.mark.slow
def test_sync_driver_killed_at_random_moments_trains_every_prompt_once(tiny_model_dir, prompts, tmp_path):
    procs = _kill_and_resume("train", tiny_model_dir, prompts, tmp_path, seed=14, kills=("random", "mid-checkpoint"),
                             extra=())
    covered = _assert_exactly_once(procs, tmp_path / "ckpt")
    print("sync: steps trained per process", covered)


@pytest.mark.slow
def test_async_driver_killed_at_random_moments_trains_every_prompt_once(tiny_model_dir, prompts, tmp_path):
    procs = _kill_and_resume("train-async", tiny_model_dir, prompts, tmp_path, seed=41,
                             kills=("mid-checkpoint", "random"),
                             extra=("--max-staleness", "2", "--use-tis"))
    covered = _assert_exactly_once(procs, tmp_path / "ckpt")
    print("async: steps trained per process", covered)


RAY_DRIVER = '''
import os, sys, time
import ray
from slick.cluster.ray_cluster import RayCluster
from slick.config import Config

cluster = RayCluster.connect(Config(), num_cpus=1)
assert cluster.started_here

@ray.remote(num_cpus=0)
class Probe:
    def pid(self):
        return os.getpid()

probe = Probe.remote()   # the handle is kept: an actor whose handle is dropped exits at once
print("actor", ray.get(probe.pid.remote(), timeout=120), flush=True)
print("ready", flush=True)
time.sleep(600)
'''


@pytest.mark.slow
def test_local_ray_cluster_and_actors_exit_after_the_driver_is_killed(tmp_path):
    """A local Ray cluster slick started (RayCluster.connect) fate-shares with the driver: after SIGKILL of
    the driver its GCS, raylet and the other head processes, and the actors, exit."""
    script = tmp_path / "ray_driver.py"
    script.write_text(RAY_DRIVER)
    log_path = tmp_path / "ray_driver.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    pids = []
    try:
        _wait(lambda: "ready" in log_path.read_text() or proc.poll() is not None, 180, "the Ray driver to start")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        actor = int(log_path.read_text().split("actor ", 1)[1].split()[0])
        pids = [actor, *_children(proc.pid)]
        assert len(pids) >= 3 and _alive(actor)      # the actor, GCS, raylet, ...
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _wait(lambda: not [p for p in pids if _alive(p)], 60, f"the Ray processes {pids} to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for p in pids:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


LAUNCHER = '''
import subprocess, sys, time
from slick.proc.children import die_with_parent, watch_parent_args
mode = sys.argv[1]
if mode == "watch":      # only the in-child parent watch (no PR_SET_PDEATHSIG)
    cmd = watch_parent_args([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], "http.server")
    child = subprocess.Popen(cmd, start_new_session=True)
else:                    # only PR_SET_PDEATHSIG (a program that knows nothing of slick)
    child = subprocess.Popen(["sleep", "1000"], start_new_session=True, preexec_fn=die_with_parent())
print("child", child.pid, flush=True)
time.sleep(1000)
'''


@pytest.mark.parametrize("mode", ["watch", "pdeathsig"])
def test_each_mechanism_alone_ends_the_child_of_a_killed_parent(tmp_path, mode):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = None
    try:
        child = int(launcher.stdout.readline().split()[1])
        time.sleep(1.0)
        assert _alive(child)
        launcher.kill()
        launcher.wait(timeout=30)
        t0 = time.monotonic()
        _wait(lambda: not _alive(child), 20, f"the {mode} child {child} to exit after its parent was killed")
        assert time.monotonic() - t0 < (10 if mode == "watch" else 2)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=30)
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_daemon_thread_pool_results_errors_and_a_stuck_call_that_does_not_block_exit(tmp_path):
    import asyncio
    import threading

    from slick.proc.children import DaemonThreadPool

    pool = DaemonThreadPool(2, "t")
    assert pool.submit(lambda a, b: a * b, 6, 7).result(timeout=10) == 42
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=10)
    release = threading.Event()

    def stuck_fn():
        release.wait(30)
        return "late"

    f = pool.submit(stuck_fn)
    _wait(lambda: pool.running(), 10, "the stuck call to start")
    (name, seconds), = pool.running()
    assert name.endswith("stuck_fn") and seconds >= 0
    assert asyncio.run(_via_loop(pool)) == 5
    pool.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(print)
    release.set()
    assert f.result(timeout=10) == "late"
    # a process whose pool thread never returns still exits at once
    code = ("import threading, time; from slick.proc.children import DaemonThreadPool; "
            "p = DaemonThreadPool(1); p.submit(threading.Event().wait); time.sleep(0.5); print('done')")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "done" and time.monotonic() - t0 < 30


async def _via_loop(pool):
    import asyncio

    return await asyncio.get_running_loop().run_in_executor(pool, lambda: 2 + 3)

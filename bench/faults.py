"""Fault-injection report: short real training runs on the tiny model, one injected fault per run.

    .venv/bin/python bench/faults.py [--only KIND[,KIND]] [--quick] [--kills 5] [--out-dir DIR] [--seed N]

Kinds (each a real `slick train` / `slick train-async` process on a random 2-layer Llama written to a temp dir):

- ``worker_kill``: two `slick serve` workers behind the real sglang-router, ``--use-fault-tolerance``; one
  worker gets SIGKILL while it is serving /generate requests of step 2.
- ``worker_hang``: the same, but the worker gets SIGSTOP (a hang: its port still accepts connections);
  the bench sends SIGKILL to the stopped process once the run is over, whatever happened.
- ``driver_kill`` / ``driver_kill_async``: the driver (sync with one `slick serve` worker / async with the
  in-process engine) with ``--save --save-interval 1``
  gets SIGKILL at ``--kills`` random moments (after a random number of the attempt's new steps, 0 = during
  start-up, plus a random part of the next step as timed in a clean run), each followed
  at once by a resume with ``--load`` on the same checkpoint directory; after each kill the bench
  counts the processes of that run still alive 10 s later (they must be 0) and removes them.
- ``reward_down``: ``--rm-type remote_rm`` against a real reward server on 127.0.0.1, stopped after the
  first step for ``--reward-down-s`` seconds and started again on the same port (``--rm-max-retries 8``:
  calls retry for up to ~40 s).
- ``disk_full``: ``--save`` on a tmpfs (``mount -t tmpfs -o size=...``, we are root) with room for one
  checkpoint and a half: the second write fails with ENOSPC. Recovered means: the run stops with an error
  naming the write, the newest complete checkpoint still loads, and a resume from it (saving elsewhere)
  finishes the run. Without tmpfs (not root) this kind is "not run".

Accounting: every run dumps its train data (``--save-debug-train-data``, one ``train_N.jsonl`` per step,
overwritten when a resumed run redoes a step, so the files left at the end are the steps the final
weights went through). ``samples lost`` = for every (epoch, prompt) the run should train, the samples
short of ``--n-samples-per-prompt``; ``prompts repeated`` = (epoch, prompt) pairs trained more than once.
``time to recover`` = from the fault to the next training step that completes (metrics.jsonl rows, polled
every 50 ms); for worker faults the run's own ``fault/recovery_time`` metric is shown too when logged.
A kind whose mechanism is missing (a flag refused, a run that fails) is reported as what happened, never
as a pass. Writes bench/results/faults.json and faults.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

KINDS = ("worker_kill", "worker_hang", "driver_kill", "driver_kill_async", "reward_down", "disk_full")
REWARD_MODULE = '''
def even_tokens(args, sample):
    ids = sample.response_ids
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
'''


def free_port() -> int:
    from slick.engines.router import free_port as fp
    return fp()


# ---------------------------------------------------------------------------------------------- setup
class Setup:
    """Model, prompts and the shared flags of every run."""

    def __init__(self, work: Path, quick: bool):
        from slick.models.tiny import make_tiny_model

        self.work = work
        self.model = make_tiny_model(work / "model")
        self.n_prompts, self.batch, self.n = (4, 2, 4) if quick else (8, 2, 4)
        self.epochs = 2
        self.steps = self.n_prompts * self.epochs // self.batch
        rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(self.n_prompts)]
        self.prompts = work / "prompts.jsonl"
        self.prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        (work / "even_rm.py").write_text(REWARD_MODULE)
        self.env = dict(os.environ, PYTHONPATH=f"{work}{os.pathsep}{ROOT}", HF_HUB_OFFLINE="1",
                        TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")

    def argv(self, run_dir: Path, driver: str = "train", reward: Optional[list] = None, extra=()) -> list[str]:
        return [sys.executable, "-m", "slick.cli", driver, "--hf-checkpoint", str(self.model),
                "--prompt-data", str(self.prompts), "--rollout-batch-size", str(self.batch),
                "--n-samples-per-prompt", str(self.n), "--rollout-max-response-len", "24",
                *(reward or ["--custom-rm-path", "even_rm.even_tokens"]), "--lr", "1e-3",
                "--num-rollout", str(self.steps), "--dtype", "fp32", "--run-dir", str(run_dir), "--no-progress",
                "--seed", "3", "--rollout-seed", "5", "--micro-batch-size", "4",
                "--save-debug-train-data", str(run_dir / "dbg"), *extra]


class Driver:
    """One driver process (its own session), its log, and a thread that timestamps new metrics rows."""

    def __init__(self, setup: Setup, argv: list[str], run_dir: Path, tag: str):
        run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir / f"{tag}.log"
        self.metrics = run_dir / "metrics.jsonl"
        self._seen = self.metrics.stat().st_size if self.metrics.exists() else 0
        self.rows: list[tuple[float, dict]] = []      # (monotonic time seen, row) of rows this process wrote
        self.started = time.monotonic()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(argv, cwd=str(setup.work), env=setup.env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.is_set():
            self._poll()
            time.sleep(0.05)

    def _poll(self):
        if not self.metrics.exists():
            return
        with open(self.metrics) as f:
            f.seek(self._seen)
            chunk = f.read()
        lines = chunk.split("\n")
        complete, rest = lines[:-1], lines[-1]
        self._seen += len(chunk) - len(rest)
        now = time.monotonic()
        for line in complete:
            if line.strip():
                self.rows.append((now, json.loads(line)))

    def wait_rows(self, k: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None and len(self.rows) < k:
            time.sleep(0.05)
        return len(self.rows) >= k

    def first_row_after(self, t: float) -> Optional[float]:
        return next((ts for ts, _ in self.rows if ts > t), None)

    def wait(self, timeout: float) -> Optional[int]:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        self._stop.set()
        self._thread.join(5)
        self._poll()
        return rc

    def descendants(self) -> list:
        import psutil
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def tail(self, n: int = 1500) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def close(self):
        self._log.close()


def leftovers(work: Path) -> list:
    """Processes (any parent) whose command line names this bench's work directory."""
    import psutil
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid != os.getpid() and any(str(work) in c for c in (p.info["cmdline"] or [])):
            out.append(p)
    return out


def kill_all(procs) -> None:
    import psutil
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


# ------------------------------------------------------------------------------------------ accounting
def account(setup: Setup, dump_dir: Path) -> dict:
    """Samples lost / prompts repeated over the train dumps left at the end of a run."""
    counts: dict[tuple, int] = {}
    steps = sorted(dump_dir.glob("train_*.jsonl"))
    for path in steps:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            key = (r["epoch"], r["prompt_index"])
            counts[key] = counts.get(key, 0) + 1
    expected = [(e, p) for e in sorted({k[0] for k in counts} or {0}) for p in range(setup.n_prompts)]
    epochs = sorted({k[0] for k in counts})
    if len(epochs) < setup.epochs:          # a whole epoch missing: every sample of it is lost
        expected += [(max(epochs or [-1]) + 1 + i, p) for i in range(setup.epochs - len(epochs))
                     for p in range(setup.n_prompts)]
    lost = sum(max(0, setup.n - counts.get(k, 0)) for k in expected)
    repeated = sum(1 for k, c in counts.items() if c > setup.n)
    return {"steps_dumped": len(steps), "samples_trained": sum(counts.values()),
            "samples_expected": setup.n * setup.n_prompts * setup.epochs,
            "samples_lost": lost, "prompts_repeated": repeated}


def finish(result: dict, setup: Setup, run_dir: Path, rc: Optional[int], drv: Driver) -> dict:
    result.update(account(setup, run_dir / "dbg"))
    result["exit_code"] = rc
    ok = rc == 0 and result["samples_lost"] == 0 and result["prompts_repeated"] == 0 \
        and result["steps_dumped"] == setup.steps
    result.setdefault("recovered", ok)
    result["recovered"] = bool(result["recovered"] and ok)
    if rc != 0:
        result["log_tail"] = drv.tail()
    return result


def refused(drv: Driver, rc: Optional[int]) -> Optional[str]:
    """The run's own refusal (exit 2 = bad flags) as a 'not run' reason."""
    if rc == 2:
        lines = [ln for ln in drv.tail(4000).splitlines() if ln.strip()]
        return "not run: the driver refused the flags: " + (lines[-1] if lines else "(no output)")
    return None


# --------------------------------------------------------------------------------------- worker faults
def _worker_port(p) -> Optional[int]:
    cmd = p.cmdline()
    return int(cmd[cmd.index("--port") + 1]) if "serve" in cmd and "--port" in cmd else None


def _inflight(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("slick_http_inflight_requests"):
            return float(line.split()[-1])
    return 0.0


def worker_fault(setup: Setup, out: Path, sig: int, name: str, timeout: float) -> dict:
    run_dir = out / name
    extra = ["--rollout-engine", "http", "--rollout-num-workers", "2", "--router", "sglang",
             "--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5",
             "--rollout-health-check-first-wait", "0"]
    drv = Driver(setup, setup.argv(run_dir, extra=extra), run_dir, "driver")
    result: dict = {"kind": name, "signal": signal.Signals(sig).name}
    victim = None
    try:
        if not drv.wait_rows(1, timeout):
            rc = drv.wait(30)
            return refused(drv, rc) or finish(dict(result, recovered=False, note="no first step"), setup,
                                               run_dir, rc, drv)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and victim is None and drv.proc.poll() is None:
            for p in drv.descendants():
                port = _worker_port(p)
                if port and _inflight(port) > 0:
                    victim = p
                    break
            time.sleep(0.02)
        if victim is None:
            rc = drv.wait(timeout)
            return finish(dict(result, recovered=False, note="no worker seen serving a request"), setup,
                          run_dir, rc, drv)
        t_fault = time.monotonic()
        result["fault_at_step"] = len(drv.rows) + 1
        os.kill(victim.pid, sig)
        rc = drv.wait(timeout)
        nxt = drv.first_row_after(t_fault)
        result["time_to_recover_s"] = round(nxt - t_fault, 2) if nxt else None
        rows = [r for _, r in drv.rows]
        for key in ("fault/engine_deaths", "fault/engine_restarts", "fault/requests_resubmitted",
                    "fault/recovery_time", "train/train_rollout_logprob_abs_diff"):
            vals = [r[key] for r in rows if key in r]
            if vals:   # the fault/* counters only grow; the logprob gap of the last step (after the replacement)
                result[key] = vals[-1] if key.startswith("train/") else max(vals)
        # recovered also means replaced: a replacement worker joined before the run ended
        result["recovered"] = bool(result.get("fault/engine_restarts"))
        if not result["recovered"]:
            result["note"] = "no replacement had joined when the run ended"
        return finish(result, setup, run_dir, rc, drv)
    finally:
        if victim is not None:
            kill_all([victim])                       # SIGSTOPped or not, it goes now
        result["orphans"] = len(leftovers(run_dir))
        kill_all(leftovers(run_dir))
        drv.close()


# --------------------------------------------------------------------------------------- driver faults
def clean_duration(setup: Setup, out: Path, driver: str, timeout: float, engine: list) -> tuple[float, float]:
    """(seconds to the first logged step, seconds per later step) of a run without faults."""
    run_dir = out / f"clean_{driver}"
    drv = Driver(setup, setup.argv(run_dir, driver, extra=[*engine, "--save", str(run_dir / "ckpt"),
                                                           "--save-interval", "1"]), run_dir, "driver")
    rc = drv.wait(timeout)
    drv.close()
    if rc != 0:
        raise RuntimeError(f"the clean {driver} run failed (rc {rc}):\n{drv.tail()}")
    times = [t - drv.started for t, _ in drv.rows]
    if len(times) < 2:
        raise RuntimeError(f"the clean {driver} run logged {len(times)} steps")
    return times[0], (times[-1] - times[0]) / (len(times) - 1)


def _checkpointed_step(ckpt: Path) -> int:
    try:
        return int((ckpt / "latest").read_text().strip())
    except (OSError, ValueError):
        return 0


def driver_kill(setup: Setup, out: Path, driver: str, kills: int, rng: random.Random, timeout: float,
                engine: list) -> dict:
    name = "driver_kill" if driver == "train" else "driver_kill_async"
    first, per_step = clean_duration(setup, out, driver, timeout, engine)
    run_dir, ckpt = out / name, out / name / "ckpt"
    result: dict = {"kind": name, "clean_first_step_s": round(first, 1), "clean_step_s": round(per_step, 1),
                    "kills": [], "orphans": 0}
    drivers: list[Driver] = []
    checkers: list[threading.Thread] = []
    for i in range(kills + 1):
        load = ["--load", str(ckpt)] if (ckpt / "latest").exists() else []
        drv = Driver(setup, setup.argv(run_dir, driver, extra=[*engine, "--save", str(ckpt), "--save-interval", "1",
                                                               *load]), run_dir, f"attempt{i}")
        drivers.append(drv)
        if result["kills"]:
            result["kills"][-1]["resumed_with_load"] = bool(load)
        if i == kills:
            break
        # a random moment tied to progress, so it falls inside the run whatever the machine's load: after a
        # random number of new steps (0: during start-up) and a random part of the next one
        left = setup.steps - _checkpointed_step(ckpt)
        if left <= 0:                                # every step is checkpointed: nothing left to kill
            break
        target, frac = rng.randrange(0, max(left - 1, 1)), rng.uniform(0.05, 0.9)
        while drv.proc.poll() is None and len(drv.rows) < target:
            time.sleep(0.01)
        t_from = drv.rows[-1][0] if target and drv.rows else drv.started
        while drv.proc.poll() is None and time.monotonic() - t_from < frac * (per_step if target else first):
            time.sleep(0.01)
        at = time.monotonic() - drv.started
        if drv.proc.poll() is not None:              # finished (or failed) before its kill moment
            result["kills"].append({"at_s": round(at, 2), "note": f"the run ended (rc {drv.proc.returncode}) first"})
            break
        tmp_dirs = [q.name for q in ckpt.glob(".tmp-*")] if ckpt.exists() else []
        children = drv.descendants()
        t_kill = time.monotonic()
        os.kill(drv.proc.pid, signal.SIGKILL)
        drv.wait(30)
        last = [r["step"] for _, r in drv.rows]
        record = {"at_s": round(at, 2), "last_step_logged": last[-1] if last else None,
                  "newest_checkpoint": _checkpointed_step(ckpt),
                  "checkpoint_write_in_progress": bool(tmp_dirs), "_t": t_kill}
        result["kills"].append(record)
        # the resume starts at once; meanwhile a thread looks 10 s later for children that outlived the driver
        checker = threading.Thread(target=_orphan_check, args=(children, record), daemon=True)
        checker.start()
        checkers.append(checker)
    rc = drv.wait(timeout)
    for c in checkers:
        c.join(30)
    result["orphans"] = sum(k.get("orphans", 0) for k in result["kills"])
    for d in drivers:
        d.close()
    # time to recover from a kill: to the next step logged, when that comes before the next kill (None: the
    # resumed run was itself killed before it logged a step)
    killed = [k for k in result["kills"] if "_t" in k]
    times = [k.pop("_t") for k in killed]
    waits = []
    for j, t in enumerate(times):
        nxt = min((ts for d in drivers for ts, _ in d.rows if ts > t), default=None)
        before_next_kill = j + 1 == len(times) or (nxt is not None and nxt < times[j + 1])
        waits.append(round(nxt - t, 2) if nxt is not None and before_next_kill else None)
    known = [w for w in waits if w is not None]
    result["time_to_recover_s"] = max(known) if known else None
    result["time_to_recover_each_s"] = waits
    # recovered: every kill was followed by a resumed run that logged a step (before the next kill or the end)
    # (a kill after the last step's checkpoint leaves nothing to train: the resumed run just exits 0)
    result["recovered"] = bool(times) and rc == 0 and all(
        w is not None or (j + 1 < len(waits)) or (k["newest_checkpoint"] or 0) >= setup.steps
        for j, (k, w) in enumerate(zip(killed, waits)))
    return finish(result, setup, run_dir, rc, drv)


def _orphan_check(children: list, record: dict, after: float = 10.0) -> None:
    """Count (and kill) the processes a killed driver had started that still run ``after`` seconds later."""
    import psutil
    time.sleep(after)
    left = []
    for q in children:
        try:
            if q.is_running() and q.status() != psutil.STATUS_ZOMBIE:
                left.append(q)
        except psutil.NoSuchProcess:
            pass
    record["orphans"] = len(left)
    kill_all(left)


# ------------------------------------------------------------------------------------------ reward down
class RewardServer:
    """A real aiohttp reward server on a fixed 127.0.0.1 port, stoppable and restartable on that port."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/score"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = None

    def _do(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self):
        from aiohttp import web

        async def score(request):
            body = await request.json()
            return web.json_response({"reward": float(len(body["response"]) % 2)})

        async def go():
            app = web.Application()
            app.router.add_post("/score", score)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        self._do(go())

    def stop(self):
        if self.runner is not None:
            self._do(self.runner.cleanup())
            self.runner = None

    def close(self):
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def reward_down(setup: Setup, out: Path, down_s: float, timeout: float) -> dict:
    run_dir = out / "reward_down"
    srv = RewardServer()
    srv.start()
    reward = ["--rm-type", "remote_rm", "--rm-url", srv.url, "--rm-max-retries", "8", "--rm-timeout", "10"]
    drv = Driver(setup, setup.argv(run_dir, reward=reward), run_dir, "driver")
    result: dict = {"kind": "reward_down", "down_s": down_s}
    try:
        if not drv.wait_rows(1, timeout):
            rc = drv.wait(30)
            return refused(drv, rc) or finish(dict(result, recovered=False), setup, run_dir, rc, drv)
        srv.stop()
        time.sleep(down_s)
        srv.start()
        t_back = time.monotonic()
        rc = drv.wait(timeout)
        nxt = drv.first_row_after(t_back)
        result["time_to_recover_s"] = round(nxt - t_back, 2) if nxt else None
        last = drv.rows[-1][1] if drv.rows else {}
        for key in ("reward/failures", "reward/remote_retries", "reward/remote_outages",
                    "reward/remote_recoveries", "reward/remote_giveups", "reward/remote_down_s"):
            if key in last:
                result[key] = last[key]
        result["reward_failures"] = last.get("reward/failures")
        result = finish(result, setup, run_dir, rc, drv)
        # a sample scored with the failure reward is a lost sample too
        result["samples_lost"] += int(last.get("reward/failures") or 0)
        result["recovered"] = result["recovered"] and not last.get("reward/failures")
        return result
    finally:
        srv.close()
        kill_all(leftovers(run_dir))
        drv.close()


# ------------------------------------------------------------------------------------------- disk full
def disk_full(setup: Setup, out: Path, timeout: float) -> dict:
    run_dir = out / "disk_full"
    probe = out / "ckpt_size"
    drv = Driver(setup, setup.argv(probe, extra=["--save", str(probe / "ckpt"), "--num-rollout", "1"]), probe, "probe")
    rc = drv.wait(timeout)
    drv.close()
    if rc != 0:
        return {"kind": "disk_full", "recovered": False, "note": f"probe run failed (rc {rc})", "log_tail": drv.tail()}
    one = sum(f.stat().st_size for f in (probe / "ckpt").rglob("*") if f.is_file())
    mnt = out / "small_disk"
    mnt.mkdir(parents=True, exist_ok=True)
    size_kb = int(one * 1.5 / 1024) + 64
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        return {"kind": "disk_full", "recovered": False,
                "note": f"not run: mount -t tmpfs failed ({mounted.stderr.strip()}); needs root"}
    result: dict = {"kind": "disk_full", "checkpoint_bytes": one, "tmpfs_kb": size_kb,
                    "injection": "tmpfs with room for 1.5 checkpoints"}
    try:
        ckpt = mnt / "ckpt"
        drv = Driver(setup, setup.argv(run_dir, extra=["--save", str(ckpt), "--save-interval", "1"]), run_dir, "full")
        rc = drv.wait(timeout)
        t_fail = time.monotonic()
        drv.close()
        log = drv.tail(20000)
        result["first_run_exit_code"] = rc
        errors = [ln for ln in log.splitlines() if "Error" in ln or "error:" in ln]
        result["error"] = errors[-1][:200] if errors else None
        result["error_named"] = any(w in log for w in ("No space left", "ENOSPC", "Errno 28", "disk full", "MiB free on that file system"))
        steps_before = [r["step"] for _, r in drv.rows]
        result["steps_before_full"] = steps_before[-1] if steps_before else 0
        if rc == 0:
            result.update(recovered=False, note="the run did not notice the full disk")
            return finish(result, setup, run_dir, rc, drv)
        result["tmp_left_on_disk"] = [p.name for p in ckpt.glob(".tmp-*")]
        # resume from what the small disk holds, saving on the big disk from now on
        big = run_dir / "ckpt_big"
        drv2 = Driver(setup, setup.argv(run_dir, extra=["--load", str(ckpt), "--save", str(big),
                                                        "--save-interval", "1"]), run_dir, "resume")
        rc2 = drv2.wait(timeout)
        drv2.close()
        nxt = drv2.first_row_after(t_fail)
        result["time_to_recover_s"] = round(nxt - t_fail, 2) if nxt else None
        result["resumed_from_step"] = steps_before[-1] if steps_before else 0
        # recovered: the surviving checkpoint loads and the run then trains every prompt once (finish checks);
        # whether the error names the disk is reported on its own (error_named)
        result["recovered"] = True
        return finish(result, setup, run_dir, rc2, drv2)
    finally:
        kill_all(leftovers(run_dir))
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ---------------------------------------------------------------------------------------------- report
COLUMNS = ("kind", "recovered", "samples_lost", "prompts_repeated", "time_to_recover_s", "orphans", "detail")


def detail(r: dict) -> str:
    if "note" in r and str(r["note"]).startswith("not run"):
        return r["note"]
    keys = ("fault/engine_deaths", "fault/engine_restarts", "fault/requests_resubmitted", "fault/recovery_time",
            "train/train_rollout_logprob_abs_diff", "reward/remote_retries", "reward/remote_giveups",
            "reward/remote_down_s", "time_to_recover_each_s", "error_named", "error",
            "tmp_left_on_disk", "exit_code", "note")
    def fmt(v):
        if isinstance(v, float):
            return str(int(v)) if v == int(v) else f"{v:.2g}" if abs(v) < 0.01 else f"{v:.2f}"
        return str(v)
    parts = [f"{k.split('/')[-1]}={fmt(r[k])}" for k in keys if k in r]
    if "kills" in r:
        def where(k):
            if "note" in k:
                return f"{k['at_s']} s: {k['note']}"
            return (f"{k['at_s']} s (steps logged {k.get('last_step_logged') or 0}, checkpoint "
                    f"{k.get('newest_checkpoint', '?')}{', during a checkpoint write' if k.get('checkpoint_write_in_progress') else ''}"
                    f", orphans {k.get('orphans', '?')})")
        parts.append("kills at " + ", ".join(where(k) for k in r["kills"]))
    return "; ".join(parts)


def table(results: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in results:
        if isinstance(r, str):
            continue
        row = []
        for c in COLUMNS:
            v = detail(r) if c == "detail" else r.get(c, "")
            row.append("yes" if v is True else "no" if v is False else "" if v is None else str(v))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def run_kind(kind: str, setup: Setup, out: Path, args, rng: random.Random) -> dict:
    from slick.engines.router import router_available

    if kind in ("worker_kill", "worker_hang"):
        if not router_available():
            return {"kind": kind, "recovered": False, "note": "not run: sglang-router is not installed"}
        sig = signal.SIGKILL if kind == "worker_kill" else signal.SIGSTOP
        return worker_fault(setup, out, sig, kind, args.timeout)
    if kind in ("driver_kill", "driver_kill_async"):
        # the sync driver runs one `slick serve` worker (so orphaned children would show), async in-process
        engine = ["--rollout-engine", "http", "--rollout-num-workers", "1"] if kind == "driver_kill" else []
        return driver_kill(setup, out, "train" if kind == "driver_kill" else "train-async", args.kills, rng,
                           args.timeout, engine)
    if kind == "reward_down":
        return reward_down(setup, out, args.reward_down_s, args.timeout)
    return disk_full(setup, out, args.timeout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(KINDS), help=f"comma-separated kinds ({', '.join(KINDS)})")
    ap.add_argument("--quick", action="store_true", help="4 prompts x 2 epochs instead of 8 x 2; 2 driver kills")
    ap.add_argument("--kills", type=int, default=None, help="driver kills per driver kind (default 5; 2 with --quick)")
    ap.add_argument("--reward-down-s", type=float, default=5.0, help="seconds the reward server stays down")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take before it counts as hung")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random kill moments")
    ap.add_argument("--out-dir", default=None, help="work directory (default: a temp dir, removed at the end)")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/results/faults.{json,md}")
    ap.add_argument("--merge", action="store_true", help="keep the other kinds' results already in faults.json "
                                                          "(replace only the kinds run now)")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"--only: unknown kind(s) {bad}; choose from {', '.join(KINDS)}")
    args.kills = args.kills if args.kills is not None else (2 if args.quick else 5)
    rng = random.Random(args.seed)
    out = Path(args.out_dir or tempfile.mkdtemp(prefix="slick-faults-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = []
    t0 = time.time()
    try:
        setup = Setup(out, args.quick)
        for kind in kinds:
            t = time.monotonic()
            print(f"== {kind}", flush=True)
            try:
                r = run_kind(kind, setup, out, args, rng)
            except Exception as e:  # noqa: BLE001 - one broken kind must not hide the others
                r = {"kind": kind, "recovered": False, "note": f"bench error: {type(e).__name__}: {e}"}
            r["wall_s"] = round(time.monotonic() - t, 1)
            results.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "log_tail"}), flush=True)
            if r.get("log_tail") and not r.get("recovered"):
                print(r["log_tail"], flush=True)
    finally:
        kill_all(leftovers(out))
        if not args.out_dir:
            shutil.rmtree(out, ignore_errors=True)
    if not args.no_write:
        import platform
        RESULTS.mkdir(parents=True, exist_ok=True)
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t0)), "quick": args.quick,
                "kills": args.kills, "seed": args.seed, "cpus": os.cpu_count(), "python": platform.python_version(),
                "load_average": os.getloadavg()}
        for r in results:
            r["meta"] = meta
        old = json.loads((RESULTS / "faults.json").read_text())["results"] \
            if args.merge and (RESULTS / "faults.json").exists() else []
        ran = {r["kind"] for r in results}
        merged = [r for r in old if r["kind"] not in ran] + results
        merged.sort(key=lambda r: KINDS.index(r["kind"]) if r["kind"] in KINDS else len(KINDS))
        (RESULTS / "faults.json").write_text(json.dumps({"results": merged}, indent=1) + "\n")
        dates = sorted({r.get("meta", {}).get("date", "?") for r in merged})
        (RESULTS / "faults.md").write_text(
            f"Fault report (`bench/faults.py`, tiny model, {os.cpu_count()} CPUs shared with other work; "
            f"measured {', '.join(dates)}; quick={args.quick})\n\n" + table(merged) + "\n")
    print(table(results))
    return 0 if all(r.get("recovered") and not r.get("orphans") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

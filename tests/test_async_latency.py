"""Latency hiding in slick train-async (docs/async.md, "Hiding latency"): against a real slow reward server on
loopback, rewards of several rollout steps are in flight at once, a slow group does not hold back the admission
of later ones, a sleeping tool or environment does not stall other episodes' decoding, the timeline metrics and
the trace file say so, and a driver killed with rewards in flight resumes exactly once."""
import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slick.loop.sync import train
from slick.loop.train_async import train_async
from tests.test_loop import make_cfg, prompts, read_jsonl  # noqa: F401 - prompts is a fixture
from tests.test_loop_async import make_async_cfg, train_rows

ROOT = Path(__file__).resolve().parents[1]


class SlowRewardServer:
    """A real aiohttp reward server on 127.0.0.1: answers ``len(response) % 3`` after ``delay(label)`` seconds and
    records every request as (label, start, end) on time.monotonic, and the labels in flight."""

    def __init__(self, delay):
        self.delay = delay if callable(delay) else (lambda label, d=delay: d)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/score"
        self.calls: list[tuple[str, float, float]] = []
        self.in_flight: collections.Counter = collections.Counter()
        self.snapshots: list[frozenset] = []      # the labels in flight, after every arrival
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _start(self):
        from aiohttp import web

        async def score(request):
            body = await request.json()
            label, t0 = str(body["label"]), time.monotonic()
            self.in_flight[label] += 1
            self.snapshots.append(frozenset(+self.in_flight))
            try:
                await asyncio.sleep(self.delay(label))
            finally:
                self.in_flight[label] -= 1
            self.calls.append((label, t0, time.monotonic()))
            return web.json_response({"reward": float(len(body["response"]) % 3)})

        app = web.Application()
        app.router.add_post("/score", score)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def remote(server, **over):
    return dict(custom_rm_path=None, rm_type="remote_rm", rm_url=server.url, **over)


def steps_in_flight(snapshot, batch=2):
    """The rollout steps whose rewards are in flight (prompts are taken in order: prompt i is step i // batch)."""
    return frozenset(int(label) // batch for label in snapshot)


def test_three_steps_rewards_in_flight_at_once_under_max_staleness_2(tiny_model_dir, prompts, tmp_path):
    """--max-staleness 2: three rollout steps' rewards wait at the same time, again after the first steps are
    trained (steps 3, 4 and 5), never four; every trained sample is within the bound, in the DataSource's order."""
    dbg = tmp_path / "dbg"
    with SlowRewardServer(1.0) as server:
        cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=2, save_debug_train_data=str(dbg),
                             **remote(server))
        asyncio.run(train_async(cfg))
    seen = {steps_in_flight(s) for s in server.snapshots}
    assert max(len(s) for s in seen) == 3
    assert frozenset({0, 1, 2}) in seen and frozenset({3, 4, 5}) in seen
    steps = train_rows(dbg)
    assert [r["prompt_index"] for s in range(6) for r in steps[s][::4]] == list(range(12))
    assert max(r["train_version"] - min(r["weight_versions"]) for rows in steps.values() for r in rows) <= 2
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert max(m["rollout/max_groups_in_flight"] for m in metrics) == 6      # (L + 1) x B groups
    assert max(m["rollout/max_rewards_in_flight"] for m in metrics) == 24    # all of their samples' rewards
    assert all(m["buffer/dropped_stale_groups"] == 0 for m in metrics)


def test_a_slow_group_does_not_hold_back_later_admissions(tiny_model_dir, prompts, tmp_path):
    """Prompt 6 (step 3) answers after 2.5 s, the others after 0.2 s: the groups of steps 4 and 5 are admitted and
    scored while it waits (the weight updates in between wait for generation only), yet the buffer still hands
    them to the trainer after it, in order, within the staleness bound."""
    dbg = tmp_path / "dbg"
    with SlowRewardServer(lambda label: 2.5 if label == "6" else 0.2) as server:
        cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=2, save_debug_train_data=str(dbg),
                             **remote(server))
        asyncio.run(train_async(cfg))
    (slow,) = [c for c in server.calls if c[0] == "6"][:1]
    later = [c for c in server.calls if int(c[0]) >= 8]              # steps 4 and 5
    assert len(later) == 16 and all(start < slow[2] for _, start, _ in later)
    assert all(end < slow[2] for _, _, end in later)                 # scored before the slow one answered
    steps = train_rows(dbg)
    assert [r["prompt_index"] for s in range(6) for r in steps[s][::4]] == list(range(12))
    assert max(r["train_version"] - min(r["weight_versions"]) for rows in steps.values() for r in rows) <= 2


def test_sync_train_scores_each_sample_as_it_finishes_and_reports_exposed_waits(tiny_model_dir, prompts, tmp_path):
    """slick train: a sample's reward starts when it finishes, while its group's other samples still generate, and
    a 0.5 s wait with nothing else to do is counted as exposed; --trace-file has every span."""
    with SlowRewardServer(0.5) as server:
        cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=2, rollout_max_response_len=24,
                       engine_max_running=2, trace_file="trace.json", **remote(server))
        asyncio.run(train(cfg))
    starts = collections.defaultdict(list)
    for label, start, _ in server.calls:
        starts[label].append(start)
    assert sorted(starts) == ["0", "1", "2", "3"] and all(len(g) == 4 for g in starts.values()), starts
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    for m in metrics:
        assert m["perf/reward_wait_exposed_time"] >= 0.45          # the last wave's wait: nothing left to generate
        assert m["perf/reward_wait_overlapped_time"] > 0.0
        assert 0.0 < m["perf/engine_busy_fraction"] < 1.0
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = collections.Counter(e["name"] for e in spans)
    assert names["generate"] == 16 and names["reward"] == 16 and names["busy"] >= 2
    # with 2 engine slots a group's 4 samples finish in 2 waves: the first wave's rewards start while the second
    # wave still generates (each sample is scored as it ends), in every group
    track = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    by_group = collections.defaultdict(lambda: {"generate": [], "reward": []})
    for e in spans:
        name = track[(e["pid"], e["tid"])]
        if e["name"] in ("generate", "reward") and name.startswith("sample "):
            by_group[name.split()[1].split(".")[0]][e["name"]].append((e["ts"], e["ts"] + e["dur"]))
    assert len(by_group) == 4
    for g, sp in by_group.items():
        assert min(a for a, _ in sp["reward"]) < max(b for _, b in sp["generate"]), (g, sp)
    assert names["train step 1"] == 1 and names["train step 2"] == 1
    reward = [e for e in spans if e["name"] == "reward"]
    assert min(e["dur"] for e in reward) >= 0.5e6                   # microseconds
    from slick.observe.inspect import data                          # `slick inspect` links the trace
    assert data.run_info(tmp_path / "run")["trace"] == "trace.json"
    assert data.trace_file(tmp_path / "run") == tmp_path / "run" / "trace.json"


SLEEPY = '''
import time
from slick.rollout.tools import tool

ENGINE = []          # the test's engine
NAPS = []            # (decode steps before, after) of the one long nap


def nap(n: int) -> str:
    """Sleep: 1 s the first time, no time after."""
    if not NAPS:
        NAPS.append(None)
        before = ENGINE[0].stats()["decode_steps"]
        time.sleep(1.0)
        NAPS[0] = (before, ENGINE[0].stats()["decode_steps"])
    return "rested"


TOOLS = [nap]


def always_nap(text):
    return [{"name": "nap", "arguments": {"n": len(text)}}]


class SleepyEnv:
    """A synchronous environment whose first step sleeps 1 s (time.sleep); two steps, then done."""

    def __init__(self, args, sample):
        self.steps = 0

    def reset(self, sample):
        return None

    def step(self, policy_message):
        self.steps += 1
        nap(self.steps)
        return "go on", 1.0, self.steps >= 2
'''


@pytest.mark.parametrize("kind", ["tool", "environment"])
def test_a_sleeping_tool_or_environment_does_not_stall_other_episodes(tiny_model_dir, tmp_path, kind):
    """One episode's 1 s tool call (or synchronous environment step) runs while the engine keeps decoding the
    other episodes' turns: engine decode steps are counted across the sleep."""
    from slick.data.source import DataSource
    from slick.engine.local import LocalEngine
    from slick.reward.hub import RewardHub
    from slick.rollout.manager import RolloutManager
    from tests.test_multiturn import make_cfg as mt_cfg, rows_for
    from tests.chat_templates import tokenizer_with

    (tmp_path / "sleepy.py").write_text(SLEEPY)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib
        sleepy = importlib.import_module("sleepy")
        flags = dict(tool_path="sleepy:TOOLS", tool_parser="sleepy:always_nap") if kind == "tool" else \
            dict(environment_path="sleepy:SleepyEnv")
        cfg = mt_cfg(tiny_model_dir, max_turns=4, max_tokens_per_turn=4, n_samples_per_prompt=4, **flags)
        engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=8, seed=0)
        sleepy.ENGINE.append(engine)
        tok = tokenizer_with(None)
        manager = RolloutManager(cfg, DataSource(rows_for(tok), cfg.n_samples_per_prompt), engine, RewardHub(cfg), tok)
        t0 = time.perf_counter()
        groups, _ = asyncio.run(manager.generate_rollout(0))
        wall = time.perf_counter() - t0
        metrics = manager.timeline.take()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("sleepy", None)
    before, after = sleepy.NAPS[0]
    total = engine.stats()["decode_steps"]
    # the other 7 episodes decode the rest of their turns during the nap; the napping one's later turns come after
    (turns,) = {s.metadata["multiturn"]["turns"] for g in groups for s in g}
    assert turns == (4 if kind == "tool" else 2)
    # each later turn: a 4-token generation = 3 decode steps (the first token comes from the prefill). During the
    # nap the other 7 episodes decode at least one more turn (a blocked loop decodes 0), and at most all their
    # remaining turns, batched together or not (episodes that finished their last turn at different moments decode
    # in different batches; how many fit in 1 s depends on the machine's load); the napping episode's own later
    # turns come after it.
    assert 3 <= after - before <= 7 * 3 * (turns - 1), (before, after, total)
    assert total - after >= 3 * (turns - 1), (before, after, total)
    assert wall > 1.0                             # the nap did happen inside the rollout
    assert metrics["perf/tool_wait_overlapped_time"] > 0.0
    assert all(s.metadata["multiturn"]["turns"] >= 2 for g in groups for s in g)


@pytest.mark.slow
def test_sigkill_with_rewards_in_flight_resumes_exactly_once(tiny_model_dir, prompts, tmp_path):
    """A real `slick train-async` process, rewards from a slow server, killed (SIGKILL) while reward requests are
    in flight after its 2nd checkpoint; resumed with --load, every prompt of both epochs is trained exactly once."""
    dbg, ckpt = tmp_path / "dbg", tmp_path / "ckpt"

    def cmd(server, *extra):
        return [sys.executable, "-m", "slick.cli", "train-async", "--hf-checkpoint", str(tiny_model_dir),
                "--prompt-data", str(prompts), "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                "--rollout-max-response-len", "16", "--rm-type", "remote_rm", "--rm-url", server.url, "--lr", "1e-3",
                "--dtype", "fp32", "--run-dir", str(tmp_path / "run"), "--no-progress", "--max-staleness", "2",
                "--use-tis", "--rollout-shuffle", "--save-debug-train-data", str(dbg), "--save", str(ckpt),
                "--save-interval", "1", "--num-epoch", "2", *extra]
    with SlowRewardServer(0.3) as server:
        proc = subprocess.Popen(cmd(server), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 300
            while not ((ckpt / "step_000002").is_dir() and sum(server.in_flight.values()) > 0):
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "no 2nd checkpoint with rewards in flight within 300 s"
                time.sleep(0.01)
            killed_in_flight = sum(server.in_flight.values())
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL and killed_in_flight > 0
        r = subprocess.run(cmd(server, "--load", str(ckpt)), cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = train_rows(dbg)
    assert sorted(steps) == list(range(12))
    seen = collections.Counter((r["epoch"], r["prompt_index"]) for rows in steps.values() for r in rows[::4])
    assert seen == collections.Counter({(e, i): 1 for e in (0, 1) for i in range(12)})
    assert all(len(rows) == 8 for rows in steps.values())

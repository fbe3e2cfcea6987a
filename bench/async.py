"""slick train vs slick train-async where latency dominates: a reward server that answers after 0, 0.1, 0.5 or 2 s,
and a multi-turn case whose tool answers after 1 s, on a tiny random model and on SmolLM2-135M-Instruct.

    .venv/bin/python bench/async.py [--models tiny,smollm2] [--cases r0,r0.1,r0.5,r2,tool1] [--tiny-steps 64]
                                    [--smollm2-steps 16] [--tag async]

Every run is a whole `slick` process (start-up, model load and exit included, as a user waits for it), with the
same flags and seeds: `slick train`, then `slick train-async --max-staleness 1` and `--max-staleness 2` (both with
--use-tis), and `--max-staleness 2 --async-weight-update continue` (an update that does not wait for the samples in
flight: with the default, `wait`, it waits until no admitted sample is generating, a multi-turn episode's tool
calls included). The task is the issue's: 8 prompts x 4 samples per step, 16 new tokens, the reward from a real HTTP
server on loopback (--rm-type remote_rm; its latency is the case's). The multi-turn case (tool1) has two turns per
episode and a tool call after the first that answers after 1 s (bench/async_tools.py), rewards at once.
Prints completions/s (whole process), the speed-up over `slick train`, and the engine's busy fraction in the async
runs' steady state (steps after the first two and before the last); writes bench/results/<tag>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from slow_reward import SlowRewardServer  # noqa: E402

DRIVERS = (("train", []), ("train-async s1", ["--max-staleness", "1", "--use-tis"]),
           ("train-async s2", ["--max-staleness", "2", "--use-tis"]),
           # a weight update that does not wait for the episodes in flight (their tool calls included)
           ("train-async s2 continue", ["--max-staleness", "2", "--use-tis", "--async-weight-update", "continue"]))
B, N, TOKENS = 8, 4, 16


def write_prompts(path: Path, steps: int) -> Path:
    rows = [{"prompt": f"Question {i}: what is {i % 7} + {i % 5}?", "label": str(i % 7 + i % 5)}
            for i in range(B * steps)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_one(model: str, model_dir: Path, case: str, driver: str, flags: list, prompts: Path, url: str,
            out_dir: Path) -> dict:
    from slick.observe.metrics import read_metrics

    run_dir = out_dir / f"{model}-{case}-{driver.replace(' ', '-')}"
    argv = [sys.executable, "-m", "slick.cli", driver.split()[0], "--hf-checkpoint", str(model_dir),
            "--prompt-data", str(prompts), "--apply-chat-template", "--rollout-batch-size", str(B),
            "--n-samples-per-prompt", str(N), "--rollout-max-response-len", str(TOKENS), "--rm-type", "remote_rm",
            "--rm-url", url, "--seed", "1", "--run-dir", str(run_dir), "--no-progress", *flags]
    if case.startswith("tool"):
        argv += ["--max-turns", "2", "--max-tokens-per-turn", str(TOKENS), "--rollout-max-response-len", "96",
                 "--tool-path", "async_tools:TOOLS", "--tool-parser", "async_tools:every_turn"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT)]),
           "SLICK_BENCH_TOOL_DELAY": case[4:] if case.startswith("tool") else "0"}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=3600)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    steps = [r for r in read_metrics(run_dir) if "perf/step_time" in r]
    steady = steps[2:-1] or steps
    busy = sum(r.get("perf/engine_busy_time", 0.0) for r in steady)
    step_s = sum(r["perf/step_time"] for r in steady)
    return {"model": model, "case": case, "driver": driver, "steps": len(steps), "wall_s": wall,
            "completions_per_sec": B * N * len(steps) / wall, "step_time_mean_s": step_s / len(steady),
            "engine_busy_steady": busy / max(step_s, 1e-9),
            "reward_wait_exposed_s": sum(r.get("perf/reward_wait_exposed_time", 0.0) for r in steps),
            "reward_wait_overlapped_s": sum(r.get("perf/reward_wait_overlapped_time", 0.0) for r in steps),
            "tool_wait_exposed_s": sum(r.get("perf/tool_wait_exposed_time", 0.0) for r in steps),
            "max_groups_in_flight": max((r.get("rollout/max_groups_in_flight", 0.0) for r in steps), default=0.0)}


def table(results: list[dict]) -> str:
    lines = ["| model | case | driver | steps | whole process (s) | completions/s | speed-up | step (s) | "
             "engine busy (steady) | reward wait exposed / overlapped (s) | groups in flight |",
             "|---" * 11 + "|"]
    base = {(r["model"], r["case"]): r for r in results if r["driver"] == "train"}
    for r in results:
        b = base.get((r["model"], r["case"]))
        speed = f"{r['completions_per_sec'] / b['completions_per_sec']:.2f}x" if b else "-"
        lines.append(f"| {r['model']} | {r['case']} | {r['driver']} | {r['steps']} | {r['wall_s']:.1f} | "
                     f"{r['completions_per_sec']:.2f} | {speed} | {r['step_time_mean_s']:.2f} | "
                     f"{r['engine_busy_steady']:.0%} | {r['reward_wait_exposed_s']:.1f} / "
                     f"{r['reward_wait_overlapped_s']:.1f} | {r['max_groups_in_flight']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--cases", default="r0,r0.1,r0.5,r2,tool1",
                    help="rX: reward latency X s; toolX: multi-turn with a tool of latency X s")
    ap.add_argument("--tiny-steps", type=int, default=64)
    ap.add_argument("--smollm2-steps", type=int, default=16)
    ap.add_argument("--drivers", default=",".join(d for d, _ in DRIVERS))
    ap.add_argument("--out-dir", default="runs/bench-async")
    ap.add_argument("--tag", default="async")
    args = ap.parse_args()

    from slick.models.smollm2 import prepare_smollm2
    from slick.models.tiny import make_tiny_model

    out = Path(args.out_dir)
    dirs = {"tiny": lambda: make_tiny_model(out / "tiny-model"), "smollm2": prepare_smollm2}
    wanted = args.drivers.split(",")
    results = []
    for model in args.models.split(","):
        model_dir = dirs[model]()
        steps = args.tiny_steps if model == "tiny" else args.smollm2_steps
        prompts = write_prompts(out / f"prompts-{steps}.jsonl", steps)
        for case in args.cases.split(","):
            delay = float(case[1:]) if case.startswith("r") else 0.0
            with SlowRewardServer(delay) as server:
                for driver, flags in DRIVERS:
                    if driver in wanted:
                        r = run_one(model, model_dir, case, driver, flags, prompts, server.url, out)
                        print(json.dumps(r), flush=True)
                        results.append(r)
    md = table(results)
    header = (f"slick train vs train-async, whole processes, {B} prompts x {N} samples per step, {TOKENS} new "
              f"tokens, tiny model {args.tiny_steps} steps, SmolLM2-135M-Instruct {args.smollm2_steps} steps, "
              f"CPU (`uptime` before: {os.getloadavg()[0]:.2f})")
    print(f"\n{header}\n\n{md}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.tag}.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    (RESULTS / f"{args.tag}.md").write_text(f"{header}\n\n{md}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

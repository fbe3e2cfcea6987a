"""slick vs TRL's GRPOTrainer on the demo task, side by side, in one invocation.

    .venv/bin/python bench/vs_trl.py [--steps 30] [--side both|slick|trl]

Same model (SmolLM2-135M-Instruct, bf16, CPU), data (single-digit addition; 25 held-out pairs x 4 = 100
held-out questions), batch (8 prompts x 8 samples per step), 48 new tokens at most, T=1.0, learning rate,
number of steps, KL off. Each side runs in its own process (clean peak RSS, no shared thread pools).
Reports completions/s, generated tokens/s, wall time per step, training time until held-out accuracy (T=1.0)
first reaches 80%, final accuracy, peak RSS, and slick's time split. Writes bench/results/vs_trl.{json,md}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_slick(args, model_dir: Path, train: Path, test: Path) -> dict:
    from slick.config import parse_config
    from slick.loop.sync import train as train_loop
    from slick.observe.metrics import read_metrics

    run_dir = Path(args.out_dir) / "slick"
    argv = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(train), "--apply-chat-template",
            "--eval-prompt-data", "heldout", str(test), "--rm-type", "gsm8k", "--advantage-estimator", "grpo",
            "--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(args.samples),
            "--rollout-max-response-len", str(args.max_new_tokens), "--rollout-temperature", "1.0",
            "--eval-temperature", "1.0", "--lr", str(args.lr), "--num-rollout", str(args.steps),
            "--eval-interval", str(args.eval_every), "--rollout-shuffle", "--run-dir", str(run_dir),
            "--seed", str(args.seed), "--micro-batch-size", "64", "--no-progress"] + shlex.split(args.slick_args)
    cfg = parse_config(argv)
    t0 = time.perf_counter()
    asyncio.run(train_loop(cfg))
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "perf/step_time" in r]
    step_s = sum(r["perf/step_time"] for r in steps)
    tokens = sum(r["rollout/generated_tokens"] for r in steps)
    comps = args.prompts * args.samples * len(steps)
    evals = [(r["step"], r["eval/heldout"]) for r in rows if "eval/heldout" in r]
    elapsed, reached = {0: 0.0}, None
    for r in steps:
        elapsed[r["step"]] = elapsed[r["step"] - 1] + r["perf/step_time"]
    for step, acc in evals:
        if reached is None and acc >= 0.8:
            reached = elapsed[step]
    # rollout = generation and scoring (wall time; groups are scored while others still generate)
    split = {k: sum(r.get(f"perf/{k}_time", 0.0) for r in steps) for k in ("rollout", "logprob", "train",
                                                                             "update_weights")}
    split["other"] = step_s - sum(split.values())
    overlapped_reward = sum(r.get("perf/reward_time", 0.0) for r in steps)
    return {"side": "slick", "num_steps": len(steps), "step_time_mean_s": step_s / max(len(steps), 1),
            "completions_per_sec": comps / step_s, "tokens_per_sec": tokens / step_s,
            "time_to_target_s": reached, "initial_accuracy": evals[0][1] if evals else None,
            "final_accuracy": evals[-1][1] if evals else None, "evals": evals, "wall_time_s": wall,
            "peak_rss_mb": peak_rss_mb(), "time_split_s": split, "reward_time_s": overlapped_reward,
            "target_accuracy": 0.8}


def run_trl_side(args, model_dir: Path, train: Path, test: Path) -> dict:
    from bench.trl_side import run_trl

    return run_trl(model_dir, train, test, steps=args.steps, prompts_per_step=args.prompts,
                   samples_per_prompt=args.samples, max_new_tokens=args.max_new_tokens, temperature=1.0,
                   lr=args.lr, eval_every=args.eval_every, seed=args.seed, out_dir=Path(args.out_dir) / "trl")


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def table(slick: dict, trl: dict) -> str:
    def ratio(a, b, inverse=False):
        if a is None or b is None or not a or not b:
            return "-"
        return f"{(b / a if inverse else a / b):.2f}x"

    rows = [
        ("completions/s", fmt(slick["completions_per_sec"]), fmt(trl["completions_per_sec"]),
         ratio(slick["completions_per_sec"], trl["completions_per_sec"])),
        ("generated tokens/s", fmt(slick["tokens_per_sec"], ".1f"), fmt(trl["tokens_per_sec"], ".1f"),
         ratio(slick["tokens_per_sec"], trl["tokens_per_sec"])),
        ("wall time per step (s)", fmt(slick["step_time_mean_s"], ".1f"), fmt(trl["step_time_mean_s"], ".1f"),
         ratio(slick["step_time_mean_s"], trl["step_time_mean_s"], inverse=True)),
        ("train time to 80% held-out (s)", fmt(slick["time_to_target_s"], ".0f"), fmt(trl["time_to_target_s"], ".0f"),
         ratio(slick["time_to_target_s"], trl["time_to_target_s"], inverse=True)),
        ("held-out accuracy, start -> end", f"{fmt(slick['initial_accuracy'])} -> {fmt(slick['final_accuracy'])}",
         f"{fmt(trl['initial_accuracy'])} -> {fmt(trl['final_accuracy'])}", ""),
        ("peak RSS (MiB)", fmt(slick["peak_rss_mb"], ".0f"), fmt(trl["peak_rss_mb"], ".0f"), ""),
    ]
    out = ["| metric | slick | TRL GRPOTrainer | slick advantage |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    split = slick["time_split_s"]
    total = sum(split.values()) or 1.0
    out += ["", "slick time split over all steps: " + ", ".join(
        f"{k} {v:.1f}s ({v / total:.0%})" for k, v in split.items())
        + f"; reward calls took {slick.get('reward_time_s', 0.0):.1f}s inside the rollout (overlapping generation)"]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=["both", "slick", "trl"], default="both")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out-dir", default="runs/vs_trl")
    ap.add_argument("--table-only", action="store_true", help="rebuild the table from the saved side results")
    ap.add_argument("--slick-args", default="", help="extra `slick train` flags for the slick side, one string "
                    "(e.g. --slick-args='--calculate-per-token-loss')")
    args = ap.parse_args(argv)

    from slick.demo.addition import write_addition_data
    from slick.models.smollm2 import prepare_smollm2

    model_dir = prepare_smollm2()
    train, test = write_addition_data(Path(args.out_dir) / "data", n_test=25, test_repeats=4)
    if args.side != "both":
        res = (run_slick if args.side == "slick" else run_trl_side)(args, model_dir, train, test)
        out = Path(args.out_dir) / f"{args.side}.json"
        out.write_text(json.dumps(res, indent=2, default=str))
        print(f"[vs_trl] {args.side}: {out}")
        return 0
    results = {}
    for side in ("slick", "trl"):  # one process each
        if not args.table_only:
            print(f"[vs_trl] running {side} ({args.steps} steps)...", flush=True)
            cmd = [sys.executable, __file__, "--side", side] + [a for a in (argv or sys.argv[1:])
                                                                 if a not in ("--side", "both")]
            subprocess.run(cmd, check=True)
        results[side] = json.loads((Path(args.out_dir) / f"{side}.json").read_text())
    md = table(results["slick"], results["trl"])
    header = (f"slick vs TRL {results['trl'].get('trl_version', '?')} GRPOTrainer, SmolLM2-135M-Instruct bf16 on "
              f"CPU, {args.prompts}x{args.samples} per step, {args.steps} steps, {args.max_new_tokens} new tokens, "
              f"T=1.0, lr {args.lr}, 100 held-out questions")
    print("\n" + header + "\n\n" + md)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vs_trl.md").write_text(header + "\n\n" + md + "\n")
    (RESULTS / "vs_trl.json").write_text(json.dumps({"config": vars(args), **results}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

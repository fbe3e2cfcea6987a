"""Every --policy-loss on the demo task, in one invocation: held-out curve, entropy curve and step time.

The demo task (``slick.demo``: single-digit addition, 30 held-out pairs, SmolLM2-135M-Instruct, CPU, GRPO 8 prompts
x 8 samples) with ``--num-steps-per-rollout 2``, so the second optimizer step of each rollout is off-policy and the
objectives differ (on-policy, at ratio 1, most of them have the same gradient). Each objective runs with its
reference's default hyperparameters, for ``--steps`` rollout steps and each of ``--seeds`` seeds, one after the
other in this process. Writes bench/results/objectives.{json,md}.

    .venv/bin/python bench/objectives.py [--steps 20] [--seeds 3] [--only cispo,sapo] [--model DIR]

A benchmark, not a test: minutes per run; quote the load average it prints (run it alone).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

OBJECTIVES = ["vanilla", "gspo", "cispo", "sapo", "gpg", "gmpo", "clip_cov", "kl_cov"]
COMMON = ["--num-steps-per-rollout", "2"]


def run_one(name: str, seed: int, model_dir: Path, runs_dir: Path, steps: int) -> dict:
    from slick.configure import build_parser, parse_config
    from slick.demo.task import demo_argv
    from slick.loop.sync import train
    from slick.observe.metrics import read_metrics

    run_dir = runs_dir / f"{name}_seed{seed}"
    argv = ["--policy-loss", name, "--seed", str(seed), "--rollout-seed", str(seed), "--num-rollout", str(steps),
            "--run-dir", str(run_dir), "--no-progress"] + COMMON
    cfg = parse_config(demo_argv(model_dir, run_dir / "data", argv), build_parser("objectives"))
    t0 = time.perf_counter()
    asyncio.run(train(cfg))
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    steps_rows = [r for r in rows if "perf/step_time" in r]
    return {"heldout": {r["step"]: r["eval/heldout"] for r in rows if "eval/heldout" in r},
            "entropy": {r["step"]: r["train/entropy_loss"] for r in rows if "train/entropy_loss" in r},
            "clipfrac": {r["step"]: r["train/pg_clipfrac"] for r in rows if "train/pg_clipfrac" in r},
            "mean_step_s": sum(r["perf/step_time"] for r in steps_rows) / max(len(steps_rows), 1),
            "wall_s": wall}


def _mean(xs):
    return statistics.mean(xs) if xs else float("nan")


def _sd(xs):
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def write_markdown(result: dict, path: Path) -> None:
    runs = result["runs"]
    lines = [f"# Every --policy-loss on the demo task ({result['steps']} steps x {result['seeds']} seed(s))", "",
             f"{result['model']}, {result['machine']}, load average {result['load_avg_start']} at the start and "
             f"{result['load_avg_end']} at the end; flags: the demo's, plus {' '.join(COMMON)}.", "",
             "| objective | held-out, first eval | held-out, last eval | entropy, first step | entropy, last step | "
             "pg_clipfrac (mean) | mean step (s) |", "|---|---|---|---|---|---|---|"]
    for name, seeds in runs.items():
        def cell(key, pick, fmt):
            vals = [pick(s[key]) for s in seeds if s[key]]
            return f"{fmt.format(_mean(vals))} ± {fmt.format(_sd(vals))}" if vals else "-"
        first = lambda d: d[min(d, key=int)]   # noqa: E731
        last = lambda d: d[max(d, key=int)]    # noqa: E731
        mean = lambda d: _mean(list(d.values()))   # noqa: E731
        lines.append(f"| {name} | {cell('heldout', first, '{:.3f}')} | {cell('heldout', last, '{:.3f}')} | "
                     f"{cell('entropy', first, '{:.3f}')} | {cell('entropy', last, '{:.3f}')} | "
                     f"{cell('clipfrac', mean, '{:.3f}')} | {_mean([s['mean_step_s'] for s in seeds]):.2f} |")
    lines += ["", "Held-out curve (mean over seeds):", "",
              "| step | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    steps = sorted({int(k) for seeds in runs.values() for s in seeds for k in s["heldout"]})
    for st in steps:
        cells = [f"{_mean([s['heldout'][k] for s in seeds for k in s['heldout'] if int(k) == st]):.3f}"
                 for seeds in runs.values()]
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    p.add_argument("--seeds", type=int, default=3, help="seeds per objective (1, 2, ...)")
    p.add_argument("--only", default=None, help="comma-separated objectives (default: all)")
    p.add_argument("--out", default="bench/results", help="directory for objectives.{json,md}")
    p.add_argument("--runs-dir", default="runs/objectives", help="run directories")
    p.add_argument("--model", default=None, help="HF model dir (default: SmolLM2-135M-Instruct from the wheel)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from slick.models.smollm2 import prepare_smollm2

    names = args.only.split(",") if args.only else OBJECTIVES
    unknown = [n for n in names if n not in OBJECTIVES]
    if unknown:
        p.error(f"--only: unknown objective(s) {', '.join(unknown)} (choose from {', '.join(OBJECTIVES)})")
    model_dir = Path(args.model) if args.model else prepare_smollm2()
    result = {"steps": args.steps, "seeds": args.seeds, "model": model_dir.name,
              "load_avg_start": round(os.getloadavg()[0], 2),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "runs": {}}
    for name in names:
        result["runs"][name] = [run_one(name, s, model_dir, Path(args.runs_dir), args.steps)
                                for s in range(1, args.seeds + 1)]
        print(name, json.dumps(result["runs"][name][-1]["heldout"]), flush=True)
    result["load_avg_end"] = round(os.getloadavg()[0], 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "objectives.json").write_text(json.dumps(result, indent=1))
    write_markdown(result, out / "objectives.md")
    print((out / "objectives.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""PPO with a learned critic and 1 sample per prompt vs GRPO with 8 samples per prompt, same completions per step.

The demo task (``slick.demo``: single-digit addition, 30 held-out pairs, SmolLM2-135M-Instruct, CPU): both runs
generate 64 completions per step (GRPO 8 prompts x 8 samples, PPO 64 prompts x 1 sample + a critic initialised
from the policy), the same learning rate, steps and evaluations (held-out questions at T=1.0, 4 samples each).
Writes bench/results/ppo_vs_grpo.{json,md}: held-out accuracy against completions trained on and wall time.

    .venv/bin/python bench/ppo_vs_grpo.py [--steps 20] [--out bench/results] [--model DIR]

A benchmark, not a test: it takes minutes (two training runs) and its numbers depend on the machine's load.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import time
from pathlib import Path

COMPLETIONS_PER_STEP = 64
RUNS = {
    "grpo_8x8": ["--advantage-estimator", "grpo", "--rollout-batch-size", "8", "--n-samples-per-prompt", "8"],
    "ppo_64x1": ["--advantage-estimator", "ppo", "--rollout-batch-size", "64", "--n-samples-per-prompt", "1",
                 "--lambd", "0.95", "--normalize-advantages", "--critic-lr", "5e-5", "--value-clip", "0.2",
                 "--num-critic-only-steps", "2"],
}


def run_one(name: str, model_dir: Path, out_root: Path, steps: int, extra: list[str]) -> dict:
    from slick.config import build_parser, parse_config
    from slick.demo.__main__ import demo_argv
    from slick.loop.sync import train
    from slick.observe.metrics import read_metrics

    run_dir = out_root / name
    argv = RUNS[name] + ["--num-rollout", str(steps), "--run-dir", str(run_dir), "--no-progress"] + extra
    cfg = parse_config(demo_argv(model_dir, run_dir / "data", argv), build_parser("ppo_vs_grpo"))
    t0 = time.perf_counter()
    asyncio.run(train(cfg))
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    evals, elapsed = [], 0.0
    for r in rows:
        elapsed += r.get("perf/step_time", 0.0)
        if "eval/heldout" in r:
            evals.append({"step": r["step"], "completions": r["step"] * COMPLETIONS_PER_STEP,
                          "step_seconds_so_far": round(elapsed, 1), "heldout": r["eval/heldout"],
                          "pass@4": r.get("eval/heldout-pass@4")})
    steps_rows = [r for r in rows if "perf/step_time" in r]
    out = {"name": name, "argv": argv, "wall_s": round(wall, 1), "evals": evals,
           "mean_step_s": round(sum(r["perf/step_time"] for r in steps_rows) / max(len(steps_rows), 1), 2),
           "mean_train_s": round(sum(r.get("perf/train_time", 0.0) for r in steps_rows) / max(len(steps_rows), 1), 2)}
    critic = [r for r in rows if "critic/explained_variance" in r]
    if critic:
        out["critic"] = [{"step": r["step"], "value_loss": r["critic/value_loss"],
                          "explained_variance": r["critic/explained_variance"]} for r in critic]
    return out


def write_markdown(result: dict, path: Path) -> None:
    lines = [f"# PPO (critic, 64 prompts x 1) vs GRPO (8 prompts x 8): {result['steps']} steps, "
             f"{COMPLETIONS_PER_STEP} completions per step", "",
             f"{result['model']}, {result['machine']}; load average at start {result['load_avg_start']}.", "",
             "| completions | " + " | ".join(f"{n} held-out (T=1.0)" for n in result["runs"]) + " |",
             "|---|" + "---|" * len(result["runs"])]
    by_step = {}
    for name, r in result["runs"].items():
        for e in r["evals"]:
            by_step.setdefault(e["completions"], {})[name] = e["heldout"]
    for c in sorted(by_step):
        lines.append(f"| {c} | " + " | ".join(f"{by_step[c].get(n, float('nan')):.1%}" for n in result["runs"])
                     + " |")
    lines += ["", "| run | wall time (s) | mean step (s) | mean train phase (s) |", "|---|---|---|---|"]
    for name, r in result["runs"].items():
        lines.append(f"| {name} | {r['wall_s']} | {r['mean_step_s']} | {r['mean_train_s']} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    p.add_argument("--out", default="bench/results", help="directory for ppo_vs_grpo.{json,md}")
    p.add_argument("--runs-dir", default="runs/ppo_vs_grpo", help="run directories")
    p.add_argument("--model", default=None, help="HF model dir (default: SmolLM2-135M-Instruct from the wheel)")
    p.add_argument("--only", choices=sorted(RUNS), default=None,
                   help="run one side only (merged with the other side's results already in --out)")
    args, extra = p.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from slick.models.smollm2 import prepare_smollm2

    model_dir = Path(args.model) if args.model else prepare_smollm2()
    result = {"steps": args.steps, "model": model_dir.name, "load_avg_start": round(os.getloadavg()[0], 2),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "extra_flags": extra, "runs": {}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ([args.only] if args.only else list(RUNS)):
        result["runs"][name] = run_one(name, model_dir, Path(args.runs_dir), args.steps, extra)
        print(json.dumps(result["runs"][name]["evals"]), flush=True)
    if args.only and (out / "ppo_vs_grpo.json").is_file():   # the other side, run before (or beside) this one
        other = json.loads((out / "ppo_vs_grpo.json").read_text())
        result["runs"] = {**{k: v for k, v in other["runs"].items() if k != args.only}, **result["runs"]}
        result["runs"] = {k: result["runs"][k] for k in RUNS if k in result["runs"]}
    (out / "ppo_vs_grpo.json").write_text(json.dumps(result, indent=1))
    write_markdown(result, out / "ppo_vs_grpo.md")
    print((out / "ppo_vs_grpo.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

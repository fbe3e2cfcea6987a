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
    from slick.configure import build_parser, parse_config
    from slick.demo.task import demo_argv
    from slick.loop.sync import train

    run_dir = out_root / name
    argv = RUNS[name] + ["--num-rollout", str(steps), "--run-dir", str(run_dir), "--no-progress"] + extra
    cfg = parse_config(demo_argv(model_dir, run_dir / "data", argv), build_parser("ppo_vs_grpo"))
    t0 = time.perf_counter()
    asyncio.run(train(cfg))
    out = summarize(name, run_dir)
    out.update(argv=argv, wall_s=round(time.perf_counter() - t0, 1))
    return out


def summarize(name: str, run_dir: Path) -> dict:
    """Held-out accuracy and training reward against completions and seconds, from a run's metrics.jsonl (also
    for a run that was stopped early: ``complete`` says whether it reached its last step)."""
    from slick.observe.metrics import read_metrics

    rows = read_metrics(run_dir)
    evals, curve, elapsed = [], [], 0.0
    for r in rows:
        elapsed += r.get("perf/step_time", 0.0)
        point = {"step": r["step"], "completions": r["step"] * COMPLETIONS_PER_STEP,
                 "step_seconds_so_far": round(elapsed, 1)}
        if "eval/heldout" in r:
            evals.append({**point, "heldout": r["eval/heldout"]})
        if "rollout/raw_reward" in r:
            curve.append({**point, "train_reward": round(r["rollout/raw_reward"], 4),
                          **({"explained_variance": round(r["critic/explained_variance"], 4),
                              "value_loss": round(r["critic/value_loss"], 5)} if "critic/value_loss" in r else {})})
    steps_rows = [r for r in rows if "perf/step_time" in r]
    n = max(len(steps_rows), 1)
    return {"name": name, "steps_done": len(steps_rows), "evals": evals, "curve": curve,
            "mean_step_s": round(sum(r["perf/step_time"] for r in steps_rows) / n, 1),
            "mean_train_s": round(sum(r.get("perf/train_time", 0.0) for r in steps_rows) / n, 1)}


def write_markdown(result: dict, path: Path) -> None:
    runs = result["runs"]
    lines = [f"# PPO (critic, 64 prompts x 1) vs GRPO (8 prompts x 8), {COMPLETIONS_PER_STEP} completions per step", "",
             f"{result['model']}, {result['machine']}, load average {result['load_avg_start']} at the start. "
             + result.get("note", ""), "",
             "Held-out accuracy (30 held-out pairs, T=1.0):", "",
             "| completions | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]

    def table(key, field, fmt):
        by = {}
        for name, r in runs.items():
            for e in r[key]:
                by.setdefault(e["completions"], {})[name] = e.get(field)
        out = []
        for c in sorted(by):
            cells = [fmt.format(by[c][n]) if by[c].get(n) is not None else "-" for n in runs]
            out.append(f"| {c} | " + " | ".join(cells) + " |")
        return out

    lines += table("evals", "heldout", "{:.1%}")
    lines += ["", "Training reward (mean over the step's 64 completions; PPO's first 2 steps train the critic only):",
              "", "| completions | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    lines += table("curve", "train_reward", "{:.3f}")
    lines += ["", "| run | steps done | wall time (s) | mean step (s) | mean train phase (s) |", "|---|---|---|---|---|"]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['steps_done']} | {r.get('wall_s', '-')} | {r['mean_step_s']} | "
                     f"{r['mean_train_s']} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="rollout steps per run")
    p.add_argument("--out", default="bench/results", help="directory for ppo_vs_grpo.{json,md}")
    p.add_argument("--runs-dir", default="runs/ppo_vs_grpo", help="run directories")
    p.add_argument("--model", default=None, help="HF model dir (default: SmolLM2-135M-Instruct from the wheel)")
    p.add_argument("--only", choices=sorted(RUNS), default=None,
                   help="run one side only (merged with the other side's results already in --out)")
    p.add_argument("--summarize", action="store_true",
                   help="run nothing: write the results of the run directories already in --runs-dir (runs that "
                        "were stopped early included)")
    args, extra = p.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from slick.models.smollm2 import prepare_smollm2

    model_dir = Path(args.model) if args.model else prepare_smollm2()
    result = {"steps": args.steps, "model": model_dir.name, "load_avg_start": round(os.getloadavg()[0], 2),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "extra_flags": extra, "runs": {}}
    if args.summarize:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result["runs"] = {n: summarize(n, Path(args.runs_dir) / n) for n in RUNS
                          if (Path(args.runs_dir) / n / "metrics.jsonl").is_file()}
        result["note"] = " ".join(extra)
        (out / "ppo_vs_grpo.json").write_text(json.dumps(result, indent=1))
        write_markdown(result, out / "ppo_vs_grpo.md")
        print((out / "ppo_vs_grpo.md").read_text())
        return 0
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

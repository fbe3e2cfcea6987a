"""The demo model on one reasoning-gym task: GRPO for ``--steps`` steps, the held-out curve (issue 56).

The demo's flags (``slick.demo.task.DEFAULTS``: SmolLM2-135M-Instruct, CPU, GRPO 8 prompts x 8 samples, lr 2e-5,
24 response tokens, held-out every 5 steps, 4 samples per held-out prompt at T=1.0) with reasoning-gym's generated
prompts instead of the demo's addition file: ``basic_arithmetic`` restricted to two one-digit terms and ``+``
(``--prompt-data reasoning-gym:...``), held-out: 32 items of another seed. Two rewards (``--reward``):

* ``last_number`` (default): the bare question (``system=none``) and the last number of the response against the
  item's answer (``--rm-type gsm8k``, the demo's reward);
* ``verifier``: reasoning-gym's ``direct`` system prompt and the task's own verifier on the last ``<answer>``
  (``--rm-type reasoning_gym``). SmolLM2-135M writes no ``<answer>`` tags (0 of 64 samples in a smoke run), so
  this reward is 0 everywhere and GRPO has nothing to learn from; it is here to show that.

Writes bench/results/envs.{json,md}.

    .venv/bin/python bench/envs.py [--steps 20] [--task basic_arithmetic] [--model DIR]

A benchmark, not a test: minutes; run it alone and quote the load average it prints.
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

TASK_CONFIG = {"basic_arithmetic": 'min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=["%2B"]'
                                    "&allow_negation=false&allow_parentheses=false",
               "leg_counting": "min_animals=1&max_animals=2"}
REWARDS = {"last_number": ("none", "gsm8k"), "verifier": ("direct", "reasoning_gym")}   # (system=, --rm-type)


def specs(task: str, reward: str = "last_number") -> tuple[str, str]:
    extra = TASK_CONFIG.get(task, "")
    system = REWARDS[reward][0]
    train = f"reasoning-gym:{task}?size=1000&seed=1&system={system}" + (f"&{extra}" if extra else "")
    held = f"reasoning-gym:{task}?size=32&seed=2&system={system}" + (f"&{extra}" if extra else "")
    return train, held


def argv_for(model_dir: Path, run_dir: Path, task: str, steps: int, reward: str = "last_number") -> list[str]:
    from slick.demo.task import DEFAULTS

    train, held = specs(task, reward)
    own = {"--prompt-data": train, "--rm-type": REWARDS[reward][1], "--num-rollout": str(steps),
           "--run-dir": str(run_dir)}
    argv = ["--hf-checkpoint", str(model_dir), "--eval-prompt-data", "heldout", held, "--no-progress"]
    for flag, value in {**DEFAULTS, **own}.items():
        argv += [flag] if value is None else [flag, value]
    return argv


def run(model_dir: Path, run_dir: Path, task: str, steps: int, reward: str) -> dict:
    from slick.configure import build_parser, parse_config
    from slick.loop.sync import train
    from slick.observe.metrics import read_metrics

    cfg = parse_config(argv_for(model_dir, run_dir, task, steps, reward), build_parser("envs"))
    t0 = time.perf_counter()
    asyncio.run(train(cfg))
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    step_rows = [r for r in rows if "perf/step_time" in r]
    return {"heldout": {r["step"]: r["eval/heldout"] for r in rows if "eval/heldout" in r},
            "reward": {r["step"]: r["rollout/raw_reward"] for r in rows if "rollout/raw_reward" in r},
            "step_s": {r["step"]: r["perf/step_time"] for r in step_rows},
            "mean_step_s": sum(r["perf/step_time"] for r in step_rows) / max(len(step_rows), 1), "wall_s": wall}


def write_markdown(result: dict, path: Path) -> None:
    r = result["run"]
    lines = [f"# {result['model']} on reasoning-gym {result['task']} ({result['steps']} GRPO steps, "
             f"--rm-type {result['rm_type']})", "",
             f"{result['machine']}, load average {result['load_avg_start']} at the start and "
             f"{result['load_avg_end']} at the end; train `{result['train']}`, held-out `{result['heldout_spec']}` "
             f"(4 samples per prompt, T=1.0); the demo's other flags (slick/demo/task.py).", "",
             f"Mean step {r['mean_step_s']:.1f} s, wall {r['wall_s']:.0f} s.", "",
             "| step | held-out accuracy | train reward (mean) |", "|---|---|---|"]
    for step in sorted({int(k) for k in r["heldout"]} | {int(k) for k in r["reward"]}):
        h = next((v for k, v in r["heldout"].items() if int(k) == step), None)
        w = next((v for k, v in r["reward"].items() if int(k) == step), None)
        lines.append(f"| {step} | {'-' if h is None else f'{h:.3f}'} | {'-' if w is None else f'{w:.3f}'} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="GRPO steps")
    p.add_argument("--task", default="basic_arithmetic", help="a reasoning-gym task")
    p.add_argument("--reward", default="last_number", choices=sorted(REWARDS), help="see the module doc")
    p.add_argument("--out", default="bench/results", help="directory for envs.{json,md}")
    p.add_argument("--runs-dir", default="runs/envs", help="run directory parent")
    p.add_argument("--model", default=None, help="HF model dir (default: SmolLM2-135M-Instruct, prepared offline)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from slick.models.smollm2 import prepare_smollm2

    model_dir = Path(args.model) if args.model else prepare_smollm2()
    train_spec, held_spec = specs(args.task, args.reward)
    result = {"task": args.task, "reward": args.reward, "rm_type": REWARDS[args.reward][1], "steps": args.steps,
              "model": model_dir.name, "train": train_spec,
              "heldout_spec": held_spec, "load_avg_start": round(os.getloadavg()[0], 2),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores"}
    run_dir = Path(args.runs_dir) / f"{args.task}_{args.reward}_{args.steps}"
    result["run"] = run(model_dir, run_dir, args.task, args.steps, args.reward)
    result["load_avg_end"] = round(os.getloadavg()[0], 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "envs.json").write_text(json.dumps(result, indent=1))
    write_markdown(result, out / "envs.md")
    print((out / "envs.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

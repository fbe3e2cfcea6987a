"""`make demo-moe` / `python -m slick.demo moe`: GRPO with routing replay on a mixture of experts, on CPU.

The model is SmolLM2-135M-Instruct upcycled into a Mixtral MoE (``slick.models.upcycle``: 4 experts, top-2, each
expert a copy of the dense MLP, so the run starts from the dense model's function). The task and flags are
``make demo``'s (single-digit addition, GRPO 8 prompts x 8 samples) with ``--use-routing-replay`` and
``--num-steps-per-rollout 2``: the second optimizer step of each rollout trains on samples the engine generated
before the first step moved the routers, so the trainer's own top-k can differ from the rollout's
(``train/moe/mismatch``), and replay makes the trainer score the experts the engine used. Printed per step:
held-out accuracy (every 5 steps), the busiest expert's load over the mean load, router entropy, routing mismatch
and the train/rollout logprob gap with replay applied.

Flags after ``moe`` are ``slick train``'s and override these (e.g. ``--num-rollout 4``); ``--moe-no-replay`` runs
the same without routing replay.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from slick.config import ConfigError
from slick.configure import build_parser, parse_config
from slick.demo.task import demo_argv, print_table
from slick.loop.sync import train
from slick.models.upcycle import prepare_smollm2_moe
from slick.observe.metrics import read_metrics

RUN_DIR = "runs/demo-moe"
EXTRA = ["--num-steps-per-rollout", "2", "--num-rollout", "10"]


def print_moe_table(run_dir: Path) -> None:
    rows = [r for r in read_metrics(run_dir) if "train/moe/load_max" in r]
    print("\n step | load max / mean | router entropy | routing mismatch | |logprob gap| (mean, max)")
    print("------+-----------------+----------------+------------------+----------------------------")
    for r in rows:
        print(f" {r['step']:>4} | {r['train/moe/load_max'] / r['train/moe/load_mean']:>15.2f} | "
              f"{r['train/moe/entropy']:>14.3f} | {r['train/moe/mismatch']:>16.2%} | "
              f"{r.get('train/train_rollout_logprob_abs_diff', float('nan')):.2e}, "
              f"{r.get('train/train_rollout_logprob_abs_diff_max', float('nan')):.2e}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m slick.demo moe", description=__doc__.splitlines()[0],
                                epilog="Other flags are slick train's and override the demo's.")
    p.add_argument("--moe-no-replay", action="store_true", help="run without --use-routing-replay")
    args, extra = p.parse_known_args(argv)
    replay = not args.moe_no_replay
    model_dir = prepare_smollm2_moe()
    run_dir = Path(extra[extra.index("--run-dir") + 1]) if "--run-dir" in extra else Path(RUN_DIR)
    flags = [x for i in range(0, len(EXTRA), 2) if EXTRA[i] not in extra for x in EXTRA[i:i + 2]]
    flags += ["--use-routing-replay"] if replay else []
    if "--run-dir" not in extra:
        flags += ["--run-dir", RUN_DIR]
    try:
        cfg = parse_config(demo_argv(model_dir, run_dir / "data", flags + extra), build_parser("slick demo moe"))
    except ConfigError as e:
        print(f"slick demo moe: {e}", file=sys.stderr)
        return 2
    print(f"[slick demo moe] GRPO on single-digit addition, {model_dir.name} (upcycled SmolLM2-135M-Instruct), "
          f"{cfg.num_rollout} steps, routing replay {'on' if replay else 'off'}, run directory {cfg.run_dir}",
          flush=True)
    asyncio.run(train(cfg))
    print_table(Path(cfg.run_dir))
    print_moe_table(Path(cfg.run_dir))
    return 0

"""The demo task's flags and data (single-digit addition with a held-out split) and its held-out table."""
from __future__ import annotations

from pathlib import Path

from slick.demo.addition import write_addition_data
from slick.observe.metrics import read_metrics

DEFAULTS = {
    "--rollout-batch-size": "8", "--n-samples-per-prompt": "8", "--rollout-max-response-len": "24",
    "--rollout-temperature": "1.0", "--advantage-estimator": "grpo", "--rm-type": "gsm8k",
    "--lr": "2e-5", "--lr-warmup-steps": "0", "--num-rollout": "20", "--eval-interval": "5",
    "--n-samples-per-eval-prompt": "4", "--eval-temperature": "1.0", "--micro-batch-size": "16",
    "--rollout-shuffle": None, "--apply-chat-template": None, "--run-dir": "runs/demo", "--seed": "1",
    "--offload-rollout": None,
}


def demo_argv(model_dir: Path, data_dir: Path, extra: list[str]) -> list[str]:
    train, test = write_addition_data(data_dir, n_test=30)
    argv = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(train), "--eval-prompt-data", "heldout", str(test)]
    for flag, value in DEFAULTS.items():
        if flag not in extra:
            argv += [flag] if value is None else [flag, value]
    return argv + extra


def print_table(run_dir: Path) -> None:
    rows = [r for r in read_metrics(run_dir) if "eval/heldout" in r]
    print("\n step | held-out accuracy (T=1.0) | pass@4")
    print("------+---------------------------+-------")
    for r in rows:
        print(f" {r['step']:>4} | {r['eval/heldout']:>25.1%} | {r.get('eval/heldout-pass@4', float('nan')):.1%}")
    if rows:
        print(f"\nheld-out accuracy: {rows[0]['eval/heldout']:.1%} -> {rows[-1]['eval/heldout']:.1%}")

"""The code example's learning curve: GRPO with the sandboxed code reward on examples/code, held-out pass rate
every 5 steps, as a user runs it (examples/code/README.md's command with more steps and eval samples).

    python bench/code_example.py [--steps 30] [--out bench/results/code_example.json]
    python bench/code_example.py --summarize RUN_DIR      # the table of a run already made with this command

Needs bubblewrap (`make sandbox`) and SmolLM2-135M-Instruct (`python -m slick.models.smollm2`). Prints a table
(step, mean train reward, held-out pass rate and pass@4) and writes JSON with the machine and load average.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def command(model_dir: str, data: Path, run_dir: Path, steps: int) -> list[str]:
    return [str(ROOT / ".venv" / "bin" / "slick"), "train", "--hf-checkpoint", model_dir,
            "--prompt-data", str(data / "train.jsonl"), "--apply-chat-template", "--rollout-shuffle",
            "--rm-type", "code", "--sandbox-timeout", "5", "--sandbox-cpu-seconds", "2",
            "--advantage-estimator", "grpo", "--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
            "--rollout-max-response-len", "96", "--lr", "2e-5", "--lr-warmup-steps", "0",
            "--num-rollout", str(steps), "--eval-prompt-data", "heldout", str(data / "test.jsonl"),
            "--eval-interval", "5", "--n-samples-per-eval-prompt", "4", "--eval-temperature", "1.0",
            "--run-dir", str(run_dir), "--no-progress"]


def summarize(run_dir: Path) -> dict:
    """Held-out pass rate at each eval and the mean train reward of the steps since the previous one."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    curve, rewards = [], []
    for r in rows:
        if "rollout/raw_reward" in r:
            rewards.append(r["rollout/raw_reward"])
        if "eval/heldout" in r:
            curve.append({"step": r.get("step", 0), "heldout_pass_rate": r["eval/heldout"],
                          "heldout_pass_at_4": r.get("eval/heldout-pass@4"),
                          "train_reward_mean": sum(rewards) / len(rewards) if rewards else None})
            rewards = []
    return {"curve": curve}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--summarize", type=Path, help="summarize this run directory instead of training")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "code_example.json")
    a = ap.parse_args(argv)
    res = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "loadavg_at_start": os.getloadavg()[0]}}
    run_dir = a.summarize
    if run_dir is None:
        from slick.models.smollm2 import prepare_smollm2
        work = Path(tempfile.mkdtemp(prefix="bench-code-"))
        subprocess.run([sys.executable, "-m", "examples.code.make_data", str(work / "data")], cwd=ROOT, check=True)
        run_dir = work / "run"
        t0 = time.perf_counter()
        subprocess.run(command(str(prepare_smollm2()), work / "data", run_dir, a.steps), cwd=ROOT, check=True)
        res["wall_seconds"] = time.perf_counter() - t0
    res.update(summarize(run_dir))
    res["machine"]["loadavg_at_end"] = os.getloadavg()[0]
    print("| step | mean train reward since the last eval | held-out pass rate | held-out pass@4 |\n|---|---|---|---|")
    for c in res["curve"]:
        tr = "-" if c["train_reward_mean"] is None else f"{c['train_reward_mean']:.3f}"
        print(f"| {c['step']} | {tr} | {c['heldout_pass_rate']:.3f} | {c['heldout_pass_at_4']:.3f} |")
    a.out.parent.mkdir(exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

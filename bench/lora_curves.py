"""Full fine-tuning vs LoRA on the demo task, as whole `slick train` runs over several seeds: held-out accuracy
curves, wall time, peak RSS, and the weight sync's seconds per step (bytes: bench/lora.py).

    python bench/lora_curves.py [--seeds 1 2 3] [--steps 10] [--ranks 8 64] [--lora-lr 2e-4]
                                [--out bench/results/lora_curves.json]

Every run is the demo's `slick train` (`python -m slick.demo`'s flags: addition, 8 prompts x 8 samples per step,
held-out accuracy at T=1 every 5 steps), timed from outside with ``os.wait4`` (wall time, peak RSS), one process
at a time; a seed sets both ``--seed`` and ``--rollout-seed`` (prompt order and sampling). Full fine-tuning keeps
the demo's learning rate; LoRA runs use ``--lora-lr`` (adapters start at zero and need a larger step) with
alpha = 2 x rank. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run(model_dir: str, data: Path, work: Path, name: str, seed: int, steps: int, extra: list[str]) -> dict:
    from slick.demo.task import DEFAULTS
    from slick.demo.addition import write_addition_data
    train, test = write_addition_data(data, n_test=30)
    run_dir = work / f"{name}-seed{seed}"
    flags = dict(DEFAULTS, **{"--num-rollout": str(steps), "--run-dir": str(run_dir), "--seed": str(seed),
                              "--rollout-seed": str(seed), "--no-progress": None})
    cmd = [str(ROOT / ".venv" / "bin" / "slick"), "train", "--hf-checkpoint", model_dir, "--prompt-data", str(train),
           "--eval-prompt-data", "heldout", str(test)]
    for k, v in flags.items():
        cmd += [k] if v is None else [k, v]
    cmd += extra
    t0 = time.perf_counter()
    with open(work / f"{name}-seed{seed}.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{name} seed {seed} failed; see {work / f'{name}-seed{seed}.log'}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    syncs = [r for r in rows if "perf/update_weights_time" in r]
    return {"wall_seconds": wall, "peak_rss_mib": usage.ru_maxrss / 1024,
            "heldout": {r["step"]: r["eval/heldout"] for r in rows if "eval/heldout" in r},
            "sync_seconds": statistics.mean(r["perf/update_weights_time"] for r in syncs) if syncs else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--lora-lr", default="2e-4")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lora_curves.json")
    a = ap.parse_args(argv)
    from slick.models.smollm2 import prepare_smollm2
    model_dir = str(prepare_smollm2())
    work = Path(tempfile.mkdtemp(prefix="bench-lora-curves-"))
    configs = {"full": []} | {f"lora-r{r}": ["--lora-rank", str(r), "--lora-alpha", str(2 * r), "--lr", a.lora_lr]
                              for r in a.ranks}
    res = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "loadavg_at_start": os.getloadavg()[0]}, "steps": a.steps, "lora_lr": a.lora_lr,
           "configs": {k: " ".join(v) for k, v in configs.items()}, "runs": {}}
    for seed in a.seeds:                       # seeds outer: the configs alternate, drift hits all alike
        for name, extra in configs.items():
            r = run(model_dir, work / "data", work, name, seed, a.steps, extra)
            res["runs"].setdefault(name, []).append(r)
            print(f"{name} seed {seed}: {r['wall_seconds']:.0f} s, held-out {r['heldout']}", flush=True)
    res["machine"]["loadavg_at_end"] = os.getloadavg()[0]
    steps = sorted({s for runs in res["runs"].values() for r in runs for s in r["heldout"]})
    print("\n| config | " + " | ".join(f"held-out step {s}" for s in steps)
          + " | wall s | peak RSS MiB | sync s |")
    print("|---|" + "---|" * (len(steps) + 3))
    summary = {}
    for name, runs in res["runs"].items():
        cells, row = [], {}
        for s in steps:
            v = [r["heldout"][s] for r in runs if s in r["heldout"]]
            m, sd = statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0
            row[s] = {"mean": m, "std": sd}
            cells.append(f"{m:.3f} ± {sd:.3f}")
        sync_s = [r["sync_seconds"] for r in runs if r["sync_seconds"] is not None]
        row.update(wall=statistics.mean(r["wall_seconds"] for r in runs), peak=max(r["peak_rss_mib"] for r in runs),
                   sync_s=statistics.mean(sync_s) if sync_s else None)
        summary[name] = row
        print(f"| {name} | " + " | ".join(cells) + f" | {row['wall']:.0f} | {row['peak']:,.0f} | "
              + (f"{row['sync_s']:.3f}" if row["sync_s"] is not None else "-") + " |")
    res["summary"] = summary
    a.out.parent.mkdir(exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {a.out} (load average {res['machine']['loadavg_at_start']:.2f} at start, "
          f"{res['machine']['loadavg_at_end']:.2f} at end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a whole `slick train` run's memory goes over time, for several flag sets side by side in one invocation.

    .venv/bin/python bench/memory_timeline.py [--variants 'defaults=;recompute=--recompute-mlp'] [--steps 30]
    .venv/bin/python bench/memory_timeline.py --variants 'defaults=;no-onednn-cache=ONEDNN_PRIMITIVE_CACHE_CAPACITY=0'

Each variant is one `slick train` process on ``bench/vs_trl.py``'s task (SmolLM2-135M-Instruct, addition, 8 x 8
samples per step, 48 new tokens, an evaluation of 400 held-out questions every 5 steps; its argv, plus the variant's
flags; leading ``NAME=value`` words, as in a shell, set environment variables for that run only), run one after
another, alone. Its resident set (``VmRSS`` of the process) is read every 0.1 s. Reported per
variant: whole-process wall time, the peak sampled RSS and when it was first reached, the RSS once the models are
loaded (before the first step's training), and the RSS at 10%, 25%, 50% and 100% of the run. Prints a table and
writes bench/results/memory_timeline.{json,md} (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.vs_trl import slick_argv  # noqa: E402

DEFAULT_VARIANTS = ("defaults=;onednn-cache-1024=ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024;no-recompute-mlp=--no-recompute-mlp;"
                    "tokens-2048=--max-tokens-per-micro-batch 2048;"
                    "bf16-moments=--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")


def rss_mib(pid: int):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def split_env(flags: str) -> tuple[dict, str]:
    """``"A=1 B=2 --x 3"`` -> ``({"A": "1", "B": "2"}, "--x 3")``: leading environment assignments, then flags."""
    words, env = shlex.split(flags), {}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, shlex.join(words)


def sample_run(cmd: list[str], log_path: Path, period_s: float = 0.1, env: dict | None = None) -> tuple[float, list]:
    """Run ``cmd`` to the end (``env``: variables added to this process' environment), reading its RSS every
    ``period_s``; (wall seconds, [(t, MiB), ...])."""
    samples, t0 = [], time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        while proc.poll() is None:
            r = rss_mib(proc.pid)
            if r is not None:
                samples.append((round(time.perf_counter() - t0, 2), round(r, 1)))
            time.sleep(period_s)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}; see {log_path}")
    return wall, samples


def first_train_start(log_path: Path, t_start: float) -> float | None:
    """Seconds from the start to the engine's first release (the first step's training begins), from the log."""
    import datetime as dt
    for line in log_path.read_text(errors="replace").splitlines():
        if "released" in line and "until the next weight update" in line:
            stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            return stamp - t_start
    return None


def summarize(name: str, flags: str, wall: float, samples: list, loaded_at) -> dict:
    peak_t, peak = max(samples, key=lambda s: s[1])

    def at(frac):
        t = frac * wall
        return min(samples, key=lambda s: abs(s[0] - t))[1]
    loaded = max((r for t, r in samples if loaded_at is not None and t <= loaded_at), default=None)
    return {"variant": name, "flags": flags, "wall_s": round(wall, 1), "peak_rss_mib": peak, "peak_first_at_s": next(
        t for t, r in samples if r == peak), "loaded_rss_mib": loaded, "first_train_at_s": loaded_at,
        "rss_at": {f"{int(f * 100)}%": at(f) for f in (0.1, 0.25, 0.5, 1.0)}, "samples": samples,
        "peak_sample_t": peak_t}


def table(rows: list[dict], meta: dict) -> str:
    out = [f"# Memory over a whole `slick train` run ({meta['steps']} steps, bench/vs_trl.py's task)", "",
           f"`{meta['command']}`; {meta['machine']}; load average {meta['load_before']} before, "
           f"{meta['load_after']} after (the runs' own threads).", "",
           "| variant | flags | wall | peak RSS | first at | RSS before the first training | 10% | 25% | 50% | end |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a = r["rss_at"]
        loaded = f"{r['loaded_rss_mib']:,.0f} MiB" if r["loaded_rss_mib"] is not None else "-"
        out.append(f"| {r['variant']} | `{r['flags'] or '(none)'}` | {r['wall_s']:.1f} s | "
                   f"{r['peak_rss_mib']:,.0f} MiB | {r['peak_first_at_s']:.0f} s | {loaded} | {a['10%']:,.0f} | "
                   f"{a['25%']:,.0f} | {a['50%']:,.0f} | {a['100%']:,.0f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="NAME=FLAGS;NAME=FLAGS... (`slick train` flags "
                    "beyond the task's; empty: the defaults)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out-dir", default="runs/memory_timeline")
    ap.add_argument("--out", default="bench/results/memory_timeline", help="results path without suffix")
    args = ap.parse_args(argv)
    variants = [v.split("=", 1) for v in args.variants.split(";") if v.strip()]
    if any(len(v) != 2 for v in variants):
        ap.error(f"--variants {args.variants!r}: each must be NAME=FLAGS")

    from slick.demo.addition import write_addition_data
    from slick.models.smollm2 import prepare_smollm2

    model = prepare_smollm2()
    base = Path(args.out_dir)
    train, test = write_addition_data(base / "data", n_test=25, test_repeats=16)
    task = SimpleNamespace(prompts=8, samples=8, max_new_tokens=48, lr=2e-5, steps=args.steps, eval_every=5,
                           seed=args.seed, precision="bf16", slick_loss="token-mean", device="cpu")
    load_before = os.getloadavg()[0]
    rows = []
    for name, flags in variants:
        print(f"[memory_timeline] {name}: {flags or '(defaults)'} ...", flush=True)
        run_dir = base / name
        run_dir.mkdir(parents=True, exist_ok=True)
        env, argv = split_env(flags)
        cmd = [sys.executable, "-m", "slick.cli", "train", *slick_argv(task, model, train, test, run_dir / "run", argv)]
        t_start = time.time()
        wall, samples = sample_run(cmd, run_dir / "stdout.log", env=env)
        rows.append(summarize(name, flags, wall, samples, first_train_start(run_dir / "stdout.log", t_start)))
    meta = {"steps": args.steps, "command": "python bench/memory_timeline.py " + " ".join(sys.argv[1:]),
            "machine": f"{os.cpu_count()} CPUs, {os.uname().machine}", "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2)}
    text = table(rows, meta)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text(text)
    Path(args.out + ".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

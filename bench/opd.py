"""On-policy distillation as slime users run it: ``--use-opd`` beside GRPO with a task reward that is always 0.

The case of issue 58, on CPU with SmolLM2-135M-Instruct:

1. The teacher: ``slick sft`` teaches the base model the ``<answer>N</answer>`` format (the chats of
   ``slick/demo/sft.py``, 2 epochs), saved under ``--out-dir``/teacher_hf (reused when there).
2. The student: the base model, ``--use-opd --opd-type trainer --opd-kl-coef 1.0 --advantage-estimator grpo``,
   a reward of 0 for every sample (:func:`zero_reward`), 16 steps of 8 prompts x 4 samples, 16 tokens, lr 5e-5.
   The only learning signal is the OPD term.

Reports ``opd/kl`` (the mean of student - teacher logprob over the student's sampled tokens) per step, and its
first 3 steps' mean against its last 3's. ``--no-baseline`` runs the term as it was before the fix (no mean
subtracted: ``add_opd_terms(..., centre=False)``), for the comparison.

    .venv/bin/python bench/opd.py --tiny             # slick's tiny random model, both taught by slick sft: minutes
    .venv/bin/python bench/opd.py                    # the fixed run
    .venv/bin/python bench/opd.py --no-baseline      # the term without its baseline (the reported behaviour)

Writes bench/results/opd.json and .md (``--out``); each invocation adds its mode's row to the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def zero_reward(args, sample) -> float:
    """The task reward of the case: always 0."""
    return 0.0


def make_teacher(model: Path, out: Path) -> Path:
    from slick.demo.sft import write_data
    from slick.loop import sft

    teacher = out / "teacher_hf"
    if (teacher / "config.json").is_file():
        return teacher
    data = write_data(out / "data")
    rc = sft.main(["--hf-checkpoint", str(model), "--prompt-data", str(data["sft_train"]), "--rollout-batch-size", "8",
                   "--num-epoch", "2", "--lr", "2e-5", "--lr-decay-style", "cosine", "--lr-decay-iters", "18",
                   "--min-lr", "2e-6", "--run-dir", str(out / "sft"), "--save-hf", str(teacher), "--no-progress"])
    if rc:
        raise SystemExit(f"slick sft failed ({rc})")
    return teacher


def tiny_pair(out: Path) -> tuple[Path, Path]:
    """``--tiny``: (student, teacher) from slick's 2-layer random Llama (SmolLM2's tokenizer), both taught the
    ``<answer>`` chats of ``slick/demo/sft.py`` by `slick sft`: the teacher 30 steps, the student 8 (it already gives
    the format some probability, as a base model gives its own answers), lr 6e-3, fp32. Minutes, not an hour."""
    from slick.demo.sft import write_data
    from slick.loop import sft
    from slick.models.tiny import make_tiny_model

    base = out / "tiny"
    if not (base / "config.json").is_file():
        make_tiny_model(base)
    data = write_data(out / "data")
    dirs = []
    for steps, name in ((8, "tiny_student"), (30, "tiny_teacher")):
        if not (out / name / "config.json").is_file():
            rc = sft.main(["--hf-checkpoint", str(base), "--prompt-data", str(data["sft_train"]),
                           "--rollout-batch-size", "8", "--num-rollout", str(steps), "--lr", "6e-3", "--dtype", "fp32",
                           "--run-dir", str(out / f"sft-{name}"), "--save-hf", str(out / name), "--no-progress",
                           "--no-rollout-store"])
            if rc:
                raise SystemExit(f"slick sft failed ({rc})")
        dirs.append(out / name)
    return dirs[0], dirs[1]


def student(model: Path, teacher: Path, out: Path, args) -> list[dict]:
    import slick.algo.assemble as assemble
    from slick.demo.sft import write_data
    from slick.loop import sync
    from slick.observe.metrics import read_metrics

    data = write_data(out / "data")
    run = out / (("tiny-" if args.tiny else "") + ("student-nobaseline" if args.no_baseline else "student"))
    if args.no_baseline:   # the term as it was before the fix: no baseline
        assemble.add_opd_terms = _raw(assemble.add_opd_terms)
    sys.path.insert(0, str(Path(__file__).parent))
    rc = sync.main(["--hf-checkpoint", str(model), "--prompt-data", str(data["train"]), "--apply-chat-template",
                    "--custom-rm-path", "opd:zero_reward", "--use-opd", "--opd-type", "trainer",
                    "--opd-teacher-load", str(teacher), "--opd-kl-coef", str(args.coef),
                    "--advantage-estimator", "grpo", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
                    "--rollout-max-response-len", "16", "--lr", "5e-5", "--num-rollout", str(args.steps),
                    "--rollout-shuffle", "--seed", str(args.seed), "--run-dir", str(run), "--no-progress",
                    "--no-rollout-store"] + (["--dtype", "fp32", "--lr", "3e-3"] if args.tiny else []))
    if rc:
        raise SystemExit(f"the student's run failed ({rc})")
    return [r for r in read_metrics(run) if "opd/kl" in r]


def _raw(fn):
    def raw(*a, **kw):
        kw["centre"] = False
        return fn(*a, **kw)
    return raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(ROOT / "runs" / "bench-opd"))
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--coef", type=float, default=1.0)
    ap.add_argument("--no-baseline", action="store_true", help="the OPD term without its baseline (before the fix)")
    ap.add_argument("--tiny", action="store_true", help="the tiny random model, both taught by slick sft (minutes)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "opd.json"))
    args = ap.parse_args()
    from slick.models.smollm2 import prepare_smollm2

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.tiny:
        model, teacher = tiny_pair(out)
    else:
        model = prepare_smollm2()
        teacher = make_teacher(model, out)
    teacher_s = time.perf_counter() - t0
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows = student(model, teacher, out, args)
    student_s = time.perf_counter() - t0
    kl = [r["opd/kl"] for r in rows]
    first, last = sum(kl[:3]) / 3, sum(kl[-3:]) / 3
    mode = "no baseline (before)" if args.no_baseline else "centred term (fixed)"
    row = {"model": "tiny" if args.tiny else "SmolLM2-135M", "mode": mode, "seed": args.seed, "coef": args.coef, "steps": len(kl), "opd_kl": kl,
           "student_logprob": [r["opd/student_logprob"] for r in rows],
           "teacher_logprob": [r["opd/teacher_logprob"] for r in rows],
           "first3": first, "last3": last, "cut": 1 - last / first, "student_s": student_s,
           "teacher_s": teacher_s, "load_start": load0, "load_end": os.getloadavg()}
    print(f"{mode}: opd/kl first 3 steps {first:.3f}, last 3 {last:.3f}: cut {row['cut']:.1%}; "
          f"per step {[round(x, 2) for x in kl]}")
    path = Path(args.out)
    prev = json.loads(path.read_text()) if path.is_file() else {}
    key = ("model", "mode", "seed", "coef")
    runs = [r for r in prev.get("runs", []) if [r.get(k) for k in key] != [row[k] for k in key]]
    runs.append(row)
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()}, "runs": runs}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    lines = ["| model | mode | seed | opd/kl first 3 steps | last 3 steps | cut | student logprob first -> last | "
             "teacher logprob first -> last | run s | load avg (1 min) start/end |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['model']} | {r['mode']} | {r['seed']} | {r['first3']:.3f} | {r['last3']:.3f} | {r['cut']:.1%} | "
                     f"{r['student_logprob'][0]:.2f} -> {r['student_logprob'][-1]:.2f} | "
                     f"{r['teacher_logprob'][0]:.2f} -> {r['teacher_logprob'][-1]:.2f} | {r['student_s']:.0f} | "
                     f"{r['load_start'][0]:.2f}/{r['load_end'][0]:.2f} |")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

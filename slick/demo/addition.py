"""Single-digit addition prompts with a held-out split (the demo task).

Every ordered pair (a, b) with a, b in 0..9 is one question; a fixed, seeded split keeps the
held-out questions out of training. Rows are chat prompts with the answer as label; the
``gsm8k`` reward (last number in the response) scores them.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

PROMPT = "What is {a} + {b}? Answer with just the number."


def addition_rows(seed: int = 0, n_test: int = 30) -> tuple[list[dict], list[dict]]:
    """Return (train_rows, test_rows) over all 100 ordered pairs; ``n_test`` pairs are held out."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": [{"role": "user", "content": PROMPT.format(a=a, b=b)}], "label": str(a + b),
             "metadata": {"a": a, "b": b}} for a, b in pairs]
    return rows[n_test:], rows[:n_test]


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    return path


def write_addition_data(out_dir: str | Path, seed: int = 0, n_test: int = 30,
                        test_repeats: int = 1) -> tuple[Path, Path]:
    """Write train.jsonl and test.jsonl under ``out_dir``; the test set repeats each held-out pair
    ``test_repeats`` times (e.g. 30 pairs x 4 = 120 questions for a less noisy T=1.0 estimate)."""
    train, test = addition_rows(seed, n_test)
    out = Path(out_dir)
    return write_jsonl(train, out / "train.jsonl"), write_jsonl(test * test_repeats, out / "test.jsonl")

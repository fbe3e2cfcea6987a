"""Show what a ``reasoning-gym:`` prompt spec gives a run: each row's messages and label, and what the task's own
verifier (``--rm-type reasoning_gym``) says to the right answer, to a wrong one and to an answer without tags.

    python -m examples.reasoning_gym.preview "reasoning-gym:basic_arithmetic,leg_counting?size=2&seed=0"
"""
from __future__ import annotations

import argparse
import json

from slick.data import load_prompt_rows
from slick.reward import builtin_score


def preview(spec: str) -> list[dict]:
    """Per row: the prompt, the label and the verifier's scores of three responses."""
    out = []
    for row in load_prompt_rows(spec):
        label, meta = row["label"], row["metadata"]
        responses = {"right": f"<answer>{label}</answer>", "wrong": "<answer>no idea</answer>", "untagged": label}
        out.append({"prompt": row["prompt"], "label": label, "item": meta["reasoning_gym"],
                    "scores": {k: builtin_score("reasoning_gym", r, label, meta) for k, r in responses.items()}})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="a --prompt-data reasoning-gym:TASK[,TASK...][?size=N&seed=S] spec")
    for row in preview(p.parse_args(argv).spec):
        print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()

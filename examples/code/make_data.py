"""Write the code example's data: ``train.jsonl`` and ``test.jsonl`` (held-out task kinds).

    python -m examples.code.make_data OUT_DIR [--n-train 400] [--n-test 24] [--seed 0]

Each row: ``{"prompt": [system, user], "label": {"tests": "assert solve(...) == ...\\n..."}, "metadata":
{"template", "k"}}`` (:mod:`examples.code.tasks`); the tests are hidden from the prompt.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from examples.code.tasks import code_rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--n-train", type=int, default=400, help="training tasks")
    p.add_argument("--n-test", type=int, default=24, help="held-out tasks")
    p.add_argument("--seed", type=int, default=0, help="seed of the task draw and split")
    a = p.parse_args(argv)
    train, test = code_rows(a.n_train, a.n_test, a.seed)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"wrote {out / 'train.jsonl'} ({len(train)}) and {out / 'test.jsonl'} ({len(test)})")


if __name__ == "__main__":
    main()

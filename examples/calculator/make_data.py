"""Write the calculator example's data: ``train.jsonl`` and ``test.jsonl`` (held out, disjoint).

    python -m examples.calculator.make_data OUT_DIR [--n-train 2000] [--n-test 40] [--digits 3 2] [--seed 0]

Each row: ``{"prompt": [system, worked example..., user], "label": "<product>", "metadata": {"a", "b"},
"tools": [calculator schema]}`` (``slick.demo.calculator``, the same task the agent demo trains on).
"""
from __future__ import annotations

import argparse

from slick.demo.calculator import write_calculator_data


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--n-train", type=int, default=2000, help="training questions")
    p.add_argument("--n-test", type=int, default=40, help="held-out questions")
    p.add_argument("--digits", type=int, nargs=2, default=(3, 2), metavar=("A", "B"), help="digits of each operand")
    p.add_argument("--seed", type=int, default=0, help="seed of the question draw and split")
    p.add_argument("--no-example", action="store_true", help="leave the worked example out of the prompt")
    a = p.parse_args(argv)
    train, test = write_calculator_data(a.out_dir, n_train=a.n_train, n_test=a.n_test, seed=a.seed,
                                        digits=tuple(a.digits), example=not a.no_example)
    print(f"wrote {train} and {test}")


if __name__ == "__main__":
    main()

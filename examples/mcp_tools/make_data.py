"""Write the MCP tools example's data: the calculator example's questions without tool schemas in the rows (the
policy is shown the MCP server's own schema).

    python -m examples.mcp_tools.make_data OUT_DIR [--n-train 2000] [--n-test 40] [--seed 0]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from slick.demo.calculator import calculator_rows
from slick.demo.addition import write_jsonl


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--n-train", type=int, default=2000, help="training questions")
    p.add_argument("--n-test", type=int, default=40, help="held-out questions")
    p.add_argument("--seed", type=int, default=0, help="seed of the question draw and split")
    a = p.parse_args(argv)
    train, test = calculator_rows(n_train=a.n_train, n_test=a.n_test, seed=a.seed)
    out = Path(a.out_dir)
    for rows in (train, test):
        for r in rows:
            del r["tools"]
    paths = write_jsonl(train, out / "train.jsonl"), write_jsonl(test, out / "test.jsonl")
    print(f"wrote {paths[0]} and {paths[1]}")


if __name__ == "__main__":
    main()

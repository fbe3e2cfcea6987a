"""Write the search example's data: ``corpus.jsonl`` (for reading), ``train.jsonl`` and ``test.jsonl``.

    python -m examples.search.make_data OUT_DIR [--towns 200] [--seed 0] [--n-test 20]   # from the repo root

Rows are ``{"prompt": [system, worked example, user], "label": "<number>", "metadata": {...}, "tools": [search schema]}``;
the held-out towns are disjoint from the training towns (and from the worked example's town).
``slick.demo.calculator.final_answer_reward`` (the last number of the last assistant turn) scores them. The search tool rebuilds the same corpus from ``SLICK_SEARCH_TOWNS`` and
``SLICK_SEARCH_SEED`` (defaults 200 and 0), so pass the same values to both.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from examples.search.corpus import build_corpus, question_rows
from examples.search.tool import SEARCH_SCHEMA, search

SYSTEM_PROMPT = ("You are a helpful assistant. Use the search tool to look up facts about towns, "
                 "then give the final answer as a number.")


def example_messages(doc: dict) -> list[dict]:
    """One worked exchange in the rollout's tool-call format: question, search call, result, answer."""
    call = json.dumps({"name": "search", "arguments": {"query": doc["name"]}})
    return [{"role": "user", "content": f"What is the population of {doc['name']}?"},
            {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
            {"role": "tool", "content": search(doc["name"])},
            {"role": "assistant", "content": str(doc["population"])}]


def search_rows(n_towns: int = 200, seed: int = 0, n_test_towns: int = 20) -> tuple[list[dict], list[dict]]:
    """(train_rows, test_rows); the questions about ``n_test_towns`` towns are held out."""
    docs = build_corpus(n_towns, seed)
    if not 0 < n_test_towns < n_towns:
        raise ValueError(f"n_test_towns={n_test_towns} must be between 1 and {n_towns - 1}")
    held_out = set(random.Random(seed + 1).sample(range(n_towns), n_test_towns))
    shot = example_messages(next(d for d in docs if d["id"] not in held_out))
    train, test = [], []
    for q in question_rows(docs):
        row = {"prompt": [{"role": "system", "content": SYSTEM_PROMPT}, *shot, {"role": "user", "content": q["question"]}],
               "label": q["label"], "metadata": q["metadata"], "tools": [SEARCH_SCHEMA]}
        (test if q["metadata"]["doc_id"] in held_out else train).append(row)
    return train, test


def _write(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_search_data(out_dir: str | Path, n_towns: int = 200, seed: int = 0,
                      n_test_towns: int = 20) -> tuple[Path, Path]:
    out = Path(out_dir)
    train, test = search_rows(n_towns, seed, n_test_towns)
    _write([{"id": d["id"], "title": d["title"], "text": d["text"]} for d in build_corpus(n_towns, seed)],
           out / "corpus.jsonl")
    return _write(train, out / "train.jsonl"), _write(test, out / "test.jsonl")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--towns", type=int, default=200, help="towns in the corpus (match SLICK_SEARCH_TOWNS)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (match SLICK_SEARCH_SEED)")
    p.add_argument("--n-test", type=int, default=20, help="held-out towns (2 questions each)")
    a = p.parse_args(argv)
    train, test = write_search_data(a.out_dir, a.towns, a.seed, a.n_test)
    print(f"wrote {train} and {test}")


if __name__ == "__main__":
    main()

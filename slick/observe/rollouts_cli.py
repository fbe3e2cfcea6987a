"""`slick rollouts RUN_DIR`: query the rollout store (slick/observe/store.py) from the command line.

A table of the samples that pass the filters, or ``--show INDEX``: one sample in full, with its tokens (text,
loss mask, rollout logprob, weight version per response token).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from slick.observe.store import StoreMissingError, loads, read_table

LIST_COLUMNS = ["step", "index", "group_index", "prompt_index", "reward", "response_length", "status", "verdict",
                "staleness", "response", "prompt", "reward_error"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slick rollouts", description="Query the rollout store of a run directory "
                                "(RUN_DIR/rollouts, written by slick train / train-async).")
    p.add_argument("run_dir", help="Run directory (or its rollouts/ store directory).")
    p.add_argument("--step", type=int, nargs="+", help="Only these steps (1-based, as in metrics.jsonl).")
    p.add_argument("--min-reward", type=float, help="Only samples with reward >= this.")
    p.add_argument("--max-reward", type=float, help="Only samples with reward <= this.")
    p.add_argument("--min-len", type=int, help="Only responses with at least this many tokens.")
    p.add_argument("--max-len", type=int, help="Only responses with at most this many tokens.")
    p.add_argument("--contains", help="Only responses containing this text (case-sensitive).")
    p.add_argument("--status", help="Only samples with this status (completed, truncated, aborted, failed).")
    p.add_argument("--sort", choices=["step", "reward", "len"], default="step",
                   help="Row order: by step then index (default), by reward or by response length (then index).")
    p.add_argument("--desc", action="store_true", help="Sort in descending order.")
    p.add_argument("--limit", type=int, default=20, help="Most rows printed (0 = all).")
    p.add_argument("--width", type=int, default=60, help="Characters of the response shown per row.")
    p.add_argument("--json", action="store_true", help="Print the matching rows as JSON lines instead of a table.")
    p.add_argument("--show", type=int, metavar="INDEX", help="Print sample INDEX in full with its tokens "
                   "(the latest stored step holding it, or the one --step names).")
    return p


def select(run_dir, *, step=None, min_reward=None, max_reward=None, min_len=None, max_len=None, contains=None,
           status=None, sort="step", desc=False, limit=0, columns=None):
    """The matching rows as a pandas DataFrame (the filters of `slick rollouts`)."""
    df = read_table(run_dir, columns=columns or LIST_COLUMNS, steps=step).to_pandas()
    keep = df["step"].notna()
    if min_reward is not None:
        keep &= df["reward"] >= min_reward
    if max_reward is not None:
        keep &= df["reward"] <= max_reward
    if min_len is not None:
        keep &= df["response_length"] >= min_len
    if max_len is not None:
        keep &= df["response_length"] <= max_len
    if contains is not None:
        keep &= df["response"].str.contains(contains, regex=False)
    if status is not None:
        keep &= df["status"] == status
    df = df[keep]
    key = {"step": ["step", "index"], "reward": ["reward", "index"], "len": ["response_length", "index"]}[sort]
    df = df.sort_values(key, ascending=[not desc, True], kind="stable")
    return df.head(limit) if limit else df


def _one_line(text, width: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def _present(v) -> bool:
    return v is not None and v == v                     # pandas shows a missing value as None or NaN


def format_table(df, width: int = 60) -> str:
    head = ["step", "index", "group", "reward", "len", "status", "verdict", "stale", "response"]
    rows = [[str(r.step), str(r.index), str(r.group_index), f"{r.reward:.4g}" if _present(r.reward) else "-",
             str(r.response_length), r.status,
             str(r.verdict) if _present(r.verdict) else ("error" if _present(r.reward_error) else "-"),
             str(int(r.staleness)) if _present(r.staleness) else "-", _one_line(r.response, width)]
            for r in df.itertuples()]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def find_sample(run_dir, index: int, step=None) -> dict:
    """The stored row of sample ``index`` (the latest step holding it, or one of ``step``); ``KeyError`` if absent."""
    import pyarrow.compute as pc

    table = read_table(run_dir, steps=step)
    hits = table.filter(pc.equal(table["index"], index))
    if hits.num_rows == 0:
        where = f"step(s) {step}" if step else "any stored step"
        raise KeyError(f"sample index {index} is not in {where} of the rollout store")
    rows = hits.to_pylist()
    return max(rows, key=lambda r: r["step"])


def token_rows(row: dict) -> list[dict]:
    """One dict per response token: position, id, text, loss mask, rollout logprob, weight version."""
    ids = row["response_ids"] or []
    texts = row.get("response_tokens") or [None] * len(ids)
    masks, logps, vers = (row.get(k) or [None] * len(ids) for k in ("loss_mask", "rollout_logprobs",
                                                                      "weight_versions"))
    return [{"pos": i, "id": t, "text": texts[i], "mask": masks[i], "logprob": logps[i], "version": vers[i]}
            for i, t in enumerate(ids)]


def format_sample(row: dict) -> str:
    out = [f"sample {row['index']}  step {row['step']}  group {row['group_index']}  prompt {row['prompt_index']}  "
           f"epoch {row['epoch']}  status {row['status']}",
           f"reward {row['reward']}  raw {row['reward_raw']}  train_version {row['train_version']}  "
           f"staleness {row['staleness']}"]
    if row.get("reward_error"):
        out.append(f"reward error: {row['reward_error']}")
    out += ["", "--- prompt", row["prompt"], "--- response", row["response"], "--- label", str(row["label"])]
    ev = loads(row.get("evidence"))
    out += ["--- evidence", json.dumps(ev, indent=2) if ev is not None else "(none)"]
    out += ["--- tokens (mask 0 = tool/environment token, not trained)",
            f"{'pos':>4}  {'id':>7}  {'mask':>4}  {'logprob':>9}  {'ver':>4}  text"]
    for t in token_rows(row):
        logp = "-" if t["logprob"] is None else f"{t['logprob']:.4f}"
        text = "?" if t["text"] is None else repr(t["text"])
        out.append(f"{t['pos']:>4}  {t['id']:>7}  {str(t['mask']):>4}  {logp:>9}  {str(t['version']):>4}  {text}")
    return "\n".join(out)


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:                              # `slick rollouts RUN | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.show is not None:
            print(format_sample(find_sample(args.run_dir, args.show, args.step)))
            return 0
        df = select(args.run_dir, step=args.step, min_reward=args.min_reward, max_reward=args.max_reward,
                    min_len=args.min_len, max_len=args.max_len, contains=args.contains, status=args.status,
                    sort=args.sort, desc=args.desc, limit=args.limit)
    except StoreMissingError as e:
        print(f"slick rollouts: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"slick rollouts: {e.args[0]}", file=sys.stderr)
        return 2
    if args.json:
        for rec in df.to_dict(orient="records"):
            print(json.dumps({k: (None if v != v else v) if isinstance(v, float) else v for k, v in rec.items()},
                             default=str))
        return 0
    if df.empty:
        print("no stored sample matches the filters", file=sys.stderr)
        return 0
    print(format_table(df, args.width))
    return 0


if __name__ == "__main__":
    sys.exit(main())

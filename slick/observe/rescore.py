"""`slick rescore RUN_DIR --rm-type T | --custom-rm-path P`: audit a run's verifier against another one.

The stored rollouts (slick/observe/store.py) are scored again through the same :class:`~slick.reward.RewardHub`
that training uses, with the verifier given here; each sample's verdict under the run's reward and under the new
one (pass: reward >= --threshold, fail, or error: the reward function failed) goes into a confusion table, and
the samples where they differ are listed with both rewards and both evidences. Samples the run paid but the
new verifier fails are where to look for reward hacking.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Optional

from slick.config import Config
from slick.observe.store import StoreMissingError, loads, read_table
from slick.reward import RewardHub
from slick.types import Sample, Status

CATEGORIES = ("pass", "fail", "error")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slick rescore", description="Re-score a run's stored rollouts with another "
                                "verifier and report where the two disagree.")
    p.add_argument("run_dir", help="Run directory (or its rollouts/ store directory).")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--rm-type", help="Built-in verifier to score with (as in slick train's --rm-type).")
    who.add_argument("--custom-rm-path", help="Dotted path to `reward(args, sample)` (as in slick train).")
    p.add_argument("--group-rm", action="store_true", help="--custom-rm-path scores a whole group at once.")
    p.add_argument("--reward-key", help="Key of the scalar in dict rewards (as in slick train).")
    p.add_argument("--rm-url", help="URL of a remote reward server (--rm-type remote_rm).")
    p.add_argument("--rm-timeout", type=float, default=30.0, help="Seconds one reward call may take.")
    p.add_argument("--rm-concurrency", type=int, default=8, help="Reward calls in flight at once.")
    p.add_argument("--step", type=int, nargs="+", help="Only these stored steps (1-based, as in metrics.jsonl).")
    p.add_argument("--limit", type=int, default=0, help="Rescore at most this many samples (0 = all).")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="A reward >= this is a pass (rule rewards are 1/0; default 0.5).")
    p.add_argument("--show", type=int, default=10, help="Disagreeing samples printed in full (0 = none).")
    p.add_argument("--json", metavar="OUT", help="Also write the whole report (every disagreement) to this file.")
    return p


def run_verifier(run_dir) -> str:
    """The reward the run trained with, read from RUN_DIR/config.yaml ("unknown" without one)."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return "unknown"
    reward = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("reward", {})
    return reward.get("custom_rm_path") or reward.get("rm_type") or "unknown"


def to_sample(row: dict, drop_rm_type: bool) -> Sample:
    """A stored row back as a Sample the hub can score (its stored reward left out)."""
    prompt = row["prompt"]
    if prompt.startswith("[{"):                         # chat prompts are stored as JSON text
        try:
            prompt = json.loads(prompt)
        except ValueError:
            pass
    meta = loads(row["metadata"]) or {}
    if drop_rm_type:
        meta.pop("rm_type", None)                        # the verifier under audit, not the sample's own
    meta.pop("reward_warning", None)
    return Sample(index=row["index"], group_index=row["group_index"], prompt_index=row["prompt_index"],
                  epoch=row["epoch"], prompt=prompt, label=loads(row["label"]), metadata=meta,
                  prompt_ids=list(row["prompt_ids"] or []), response_ids=list(row["response_ids"] or []),
                  response=row["response"], rollout_logprobs=list(row["rollout_logprobs"] or []),
                  loss_mask=list(row["loss_mask"] or []), weight_versions=list(row["weight_versions"] or []),
                  status=Status(row["status"]))


def category(reward: Optional[float], error, threshold: float) -> str:
    if error or reward is None:
        return "error"
    return "pass" if reward >= threshold else "fail"


def make_config(args):
    values = {"rm_type": args.rm_type, "custom_rm_path": args.custom_rm_path, "group_rm": args.group_rm,
              "reward_key": args.reward_key, "rm_url": args.rm_url, "rm_timeout": args.rm_timeout,
              "rm_concurrency": args.rm_concurrency}
    return Config.from_flat(values)


class RescoreError(ValueError):
    """The verifier asked for cannot be built (unknown --rm-type, bad --custom-rm-path, ...)."""


async def _score(hub, groups: list[list[Sample]]) -> None:
    try:
        await asyncio.gather(*(hub.score_group(g) for g in groups))
    finally:
        await hub.close()


def rescore(run_dir, args) -> dict:
    """Score the stored rows again with the verifier in ``args``; the report as a dict."""
    table = read_table(run_dir, steps=args.step)
    rows = table.to_pylist()
    rows.sort(key=lambda r: (r["step"], r["index"]))
    if args.limit:
        rows = rows[:args.limit]
    try:
        hub = RewardHub(make_config(args))
    except ValueError as e:
        raise RescoreError(str(e)) from None
    samples = [to_sample(r, drop_rm_type=bool(args.rm_type)) for r in rows]
    groups: dict = {}
    for s, r in zip(samples, rows):                      # one group per (step, group index), for --group-rm
        groups.setdefault((r["step"], s.group_index), []).append(s)
    asyncio.run(_score(hub, list(groups.values())))
    new_name = args.rm_type or args.custom_rm_path
    confusion = {a: {b: 0 for b in CATEGORIES} for a in CATEGORIES}
    disagreements, old_sum, new_sum = [], 0.0, 0.0
    for r, s in zip(rows, samples):
        error = s.metadata.get("reward_error")
        new = None if error else hub.scalar(s)
        old_cat = category(r["reward"], r["reward_error"], args.threshold)
        new_cat = category(new, error, args.threshold)
        confusion[old_cat][new_cat] += 1
        old_sum += r["reward"] or 0.0
        new_sum += new if new is not None else hub.failure_reward
        if old_cat != new_cat:
            disagreements.append({
                "step": r["step"], "index": r["index"], "group_index": r["group_index"], "prompt": r["prompt"],
                "response": r["response"], "label": loads(r["label"]), "run_reward": r["reward"],
                "new_reward": new, "run_verdict": old_cat, "new_verdict": new_cat,
                "run_evidence": loads(r["evidence"]), "new_evidence": getattr(s, "evidence", None) or None,
                "run_error": r["reward_error"], "new_error": error})
    n = len(rows)
    return {"run_dir": str(run_dir), "run_verifier": run_verifier(run_dir), "new_verifier": new_name,
            "threshold": args.threshold, "samples": n, "steps": sorted({r["step"] for r in rows}),
            "agree": n - len(disagreements), "disagree": len(disagreements),
            "run_pass_new_fail": confusion["pass"]["fail"], "run_fail_new_pass": confusion["fail"]["pass"],
            "confusion": confusion, "mean_reward_run": old_sum / max(n, 1), "mean_reward_new": new_sum / max(n, 1),
            "new_failures": sum(confusion[a]["error"] for a in CATEGORIES),
            "disagreements": disagreements}


def format_report(rep: dict, show: int = 10) -> str:
    old, new = f"run ({rep['run_verifier']})", rep["new_verifier"]
    n, d = rep["samples"], rep["disagree"]
    out = [f"rescored {n} samples of steps {rep['steps']} in {rep['run_dir']} with {new}",
           f"agree {rep['agree']}, disagree {d} ({100.0 * d / max(n, 1):.1f}%): {rep['run_pass_new_fail']} paid by "
           f"the run but failed by {new} (reward hacking?), {rep['run_fail_new_pass']} failed by the run but "
           f"passed by {new}", f"mean reward: run {rep['mean_reward_run']:.4f}, {new} {rep['mean_reward_new']:.4f}",
           "", f"verdicts (rows: {old}; columns: {new}; pass = reward >= {rep['threshold']})"]
    width = max(len("run: error"), 10)
    out.append(" " * width + "".join(f"{c:>8}" for c in CATEGORIES))
    for a in CATEGORIES:
        out.append(f"run: {a}".ljust(width) + "".join(f"{rep['confusion'][a][b]:>8}" for b in CATEGORIES))
    shown = rep["disagreements"][:show]
    if shown:
        out += ["", f"disagreeing samples ({len(shown)} of {d}):"]
    for x in shown:
        out += ["", f"step {x['step']} sample {x['index']} group {x['group_index']}: run {x['run_reward']} "
                    f"({x['run_verdict']}) vs {new} {x['new_reward']} ({x['new_verdict']})",
                f"  prompt:   {_clip(x['prompt'])}", f"  response: {_clip(x['response'])}",
                f"  label:    {_clip(json.dumps(x['label']))}",
                f"  run evidence: {_evidence(x['run_evidence'], x['run_error'])}",
                f"  {new} evidence: {_evidence(x['new_evidence'], x['new_error'])}"]
    return "\n".join(out)


def _evidence(evidence, error) -> str:
    if evidence is None and error is None:
        return "(none stored)"
    return _clip(json.dumps(evidence if evidence is not None else {"error": error}))


def _clip(text, n: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rep = rescore(args.run_dir, args)
    except StoreMissingError as e:
        print(f"slick rescore: {e}", file=sys.stderr)
        return 2
    except RescoreError as e:
        print(f"slick rescore: {e}", file=sys.stderr)
        return 2
    print(format_report(rep, args.show))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=2, default=str) + "\n", encoding="utf-8")
        print(f"\nreport written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

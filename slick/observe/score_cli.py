"""`slick score --rm-type T --data FILE.jsonl [--out scored.jsonl]`: try a verifier on rows before training.

Each row of the JSONL file is an object with a prompt, a response and a label (``--input-key``,
``--response-key``, ``--label-key``; an optional metadata dict under ``--metadata-key``, whose ``rm_type``
overrides ``--rm-type`` as in training). The rows are scored by the same :class:`~slick.reward.RewardHub`
training uses, with any reward slick has (every flag of the ``reward`` and ``sandbox`` groups is accepted:
``--rm-type code --sandbox-timeout 5``, ``--custom-rm-path pkg.mod:fn``, ``--rm-type remote_rm --rm-url ...``).
It prints a table (line, reward, verdict, answer, error) with a summary, then each row's evidence; with
``--out`` it writes every row back with its ``reward`` and ``evidence`` added, following the output rules of
``slick export``: only a new file or one ``slick score`` wrote, never ``--data``, refused before any work. A row that is not a JSON object,
or lacks the response or label key, is reported by file and line and nothing is scored (exit code 2).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

from slick.config import Config, ConfigError
from slick.config.fields import field_choices, field_help, flag_name
from slick.config.groups import RewardConfig, SandboxConfig
from slick.reward import RewardHub
from slick.ckpt.atomic_files import write_text_atomic
from slick.ckpt.output_dirs import file_target_problem
from slick.types import Sample

FLAG_GROUPS = (RewardConfig, SandboxConfig)
WIDTH = 48


def _type_of(f: dataclasses.Field):
    name = str(f.type)
    return int if "int" in name else float if "float" in name else str


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slick score", description="Score (prompt, response, label) rows with a "
                                "verifier and show its evidence: test a reward before spending compute on it.")
    p.add_argument("--data", required=True, help="JSONL file of rows to score.")
    p.add_argument("--out", help="Write every row back here (JSONL) with its `reward` and `evidence` added.")
    p.add_argument("--input-key", default="prompt", help="Key of the prompt in each row (default: prompt).")
    p.add_argument("--response-key", default="response", help="Key of the response in each row (default: response).")
    p.add_argument("--label-key", default="label", help="Key of the label in each row (default: label).")
    p.add_argument("--metadata-key", default="metadata", help="Key of an optional metadata dict (default: metadata).")
    p.add_argument("--limit", type=int, default=0, help="Score only the first N rows (0 = all).")
    p.add_argument("--evidence-chars", type=int, default=300,
                   help="Print each row's evidence cut to this many characters (0 = do not print it).")
    for cls in FLAG_GROUPS:
        grp = p.add_argument_group(cls.__name__.replace("Config", "").lower())
        for f in dataclasses.fields(cls):
            kw = dict(dest=f.name, default=f.default, help=f"{field_help(f)} (default: {f.default!r})".replace("%", "%%"))
            if isinstance(f.default, bool):
                grp.add_argument(flag_name(f.name), action="store_true", **kw)
                continue
            grp.add_argument(flag_name(f.name), type=_type_of(f), choices=field_choices(f), **kw)
    return p


def read_rows(path: str, args) -> list[tuple[int, dict]]:
    """``[(line number, row)]``; :class:`ConfigError` naming every bad row by file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"--data: file not found: {path}"])
    rows, problems = [], []
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                problems.append(f"{path}:{n}: not valid JSON ({e.msg}, column {e.colno})")
                continue
            if not isinstance(row, dict):
                problems.append(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
                continue
            missing = [k for k in (args.response_key, args.label_key) if k not in row]
            if missing:
                problems.append(f"{path}:{n}: missing key(s) {', '.join(map(repr, missing))} "
                                f"(has {', '.join(map(repr, sorted(row)))}; see --response-key / --label-key)")
                continue
            if not isinstance(row.get(args.metadata_key, {}) or {}, dict):
                problems.append(f"{path}:{n}: {args.metadata_key!r} must be an object")
                continue
            rows.append((n, row))
    if problems:
        raise ConfigError(problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else []))
    if not rows:
        raise ConfigError([f"{path}: no rows"])
    return rows[:args.limit] if args.limit else rows


def to_sample(i: int, row: dict, args) -> Sample:
    response = row[args.response_key]
    return Sample(index=i, group_index=i, prompt=row.get(args.input_key, ""), label=row[args.label_key],
                  metadata=dict(row.get(args.metadata_key) or {}),
                  response=response if isinstance(response, str) else json.dumps(response))


async def _score(hub: RewardHub, samples: list[Sample]) -> None:
    try:
        await asyncio.gather(*(hub.score_group([s]) for s in samples))
    finally:
        await hub.close()


def _cut(value, width: int = WIDTH) -> str:
    text = "" if value is None else str(value).replace("\n", "\\n")
    return text if len(text) <= width else text[:width - 3] + "..."


def format_table(rows: list[tuple[int, dict]], samples: list[Sample], hub: RewardHub, path: str,
                 evidence_chars: int) -> str:
    out = [f"{'line':>6}  {'reward':>7}  {'verdict':<7}  {'answer':<{WIDTH}}  error"]
    total, passed, failed = 0.0, 0, 0
    for (n, _), s in zip(rows, samples):
        ev = s.evidence or {}
        error = ev.get("error")
        reward = hub.scalar(s)
        total += reward
        passed += ev.get("verdict") is True
        failed += error is not None
        out.append(f"{n:>6}  {reward:>7.3f}  {str(ev.get('verdict')):<7}  {_cut(ev.get('answer')):<{WIDTH}}  "
                   f"{_cut(error, 80) if error else ''}")
    out.append(f"{len(samples)} rows of {path}: mean reward {total / len(samples):.4f}, verdict true {passed}, "
               f"verifier failures {failed}")
    if evidence_chars:
        out.append("")
        out += [f"line {n}: {_cut(json.dumps(s.evidence, ensure_ascii=False), evidence_chars)}"
                for (n, _), s in zip(rows, samples)]
    return "\n".join(out)


def is_score_output(path: Path) -> bool:
    """``path`` is a file ``slick score --out`` wrote: its first row is an object with ``reward`` and
    ``evidence``."""
    try:
        with path.open(encoding="utf-8") as fh:
            first = next((line for line in fh if line.strip()), "")
        row = json.loads(first)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(row, dict) and "reward" in row and "evidence" in row


def out_problem(args) -> Optional[str]:
    """Why ``--out`` cannot be written (the output rules of ``slick export``, for a file): checked before
    any row is read or scored."""
    return file_target_problem(args.out, "--out", [("--data", args.data)], is_score_output)


def write_out(path: str, rows: list[tuple[int, dict]], samples: list[Sample], hub: RewardHub) -> None:
    """Every row with its reward and evidence, written whole or not at all (no temp file left on failure)."""
    lines = [json.dumps({**row, "reward": s.reward, "evidence": s.evidence}, ensure_ascii=False) + "\n"
             for (_, row), s in zip(rows, samples)]
    write_text_atomic(path, "".join(lines))


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    problem = out_problem(args) if args.out else None
    if problem:
        raise ConfigError([problem])
    rows = read_rows(args.data, args)
    values = {f.name: getattr(args, f.name) for cls in FLAG_GROUPS for f in dataclasses.fields(cls)}
    if values["custom_rm_path"]:
        values["rm_type"] = None
    try:
        hub = RewardHub(Config.from_flat(values))
    except (ValueError, RuntimeError) as e:
        raise ConfigError([str(e)]) from None
    samples = [to_sample(i, row, args) for i, (_, row) in enumerate(rows)]
    asyncio.run(_score(hub, samples))
    print(format_table(rows, samples, hub, args.data, args.evidence_chars))
    if args.out:
        write_out(args.out, rows, samples, hub)
        print(f"wrote {len(samples)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

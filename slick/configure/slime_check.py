"""``slick slime-check SCRIPT``: what slick will do with a slime launch script, flag by flag.

The script is read, never run: backslash continuations are joined, ``NAME=( ... )`` arrays and ``NAME=value``
variables (``${NAME:-default}`` takes the default) are collected, and the first command that runs ``train.py``
or ``train_async.py`` (``python3 train.py ...``, or after ``ray job submit ... --``) gives the argument list,
with ``${NAME[@]}`` spliced and ``$NAME`` / ``${NAME}`` substituted. Each flag is then one of

* ``same``: slick's flag of that name;
* ``mapped``: slime's spelling of a slick flag (what it becomes);
* ``engine``: an ``--sglang-*`` / ``--vllm-*`` option for the engines slick launches;
* ``accepted``: what slick always does; ``checked``: a model-shape flag checked against config.json;
  ``no-op``: no effect on results in slick, and why;
* ``refused``: slick stops with this reason (``unknown`` when slick has no such flag).

Then slick's own parser reads the whole list (no files are opened) and any problem it finds is printed. Exit 0
when nothing is refused, 1 otherwise, 2 when the script has no train.py command.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
import shlex
import sys
from pathlib import Path
from typing import Optional

from slick.config import ConfigError
from slick.config import slime as spellings
from slick.config import slime_table as table
from slick.configure.parse import build_parser, parse_config

ENTRY = re.compile(r"(^|/)train(_async)?\.py$")
ARRAY_START = re.compile(r"^\s*(?:declare\s+-a\s+|local\s+)?([A-Za-z_]\w*)=\((.*)$")
SCALAR = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")
SPLICE = re.compile(r"^\$\{([A-Za-z_]\w*)\[@\]\}$")
STOP_TOKENS = {";", "&&", "||", "|", "&", ">", ">>", "2>&1"}
# rollout functions of slime's that name what a slick command does
ROLLOUT_FUNCTIONS = {"slime.rollout.fully_async_rollout.generate_rollout_fully_async":
                     "slick train-async (generation overlaps training, --max-staleness bounds the lag)"}


class ScriptError(ValueError):
    pass


def logical_lines(text: str) -> list[str]:
    return text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines()


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return text.split()


def read_script(text: str, base: Optional[Path] = None) -> tuple[str, list[str]]:
    """(``train.py`` or ``train_async.py``, its argument list expanded) of a slime launch script. ``base``: the
    script's directory: ``${SCRIPT_DIR}`` there, and ``source FILE`` (slime's ``scripts/models/*.sh``) read when
    the file exists."""
    arrays: dict[str, list[str]] = {}
    scalars: dict[str, str] = {"SCRIPT_DIR": str(base)} if base is not None else {}
    found = _read(text, base, arrays, scalars)
    if found is None:
        raise ScriptError("no `python3 train.py ...` or `train_async.py` command in the script")
    return found


def _read(text: str, base: Optional[Path], arrays: dict, scalars: dict, depth: int = 0):
    lines = logical_lines(text)
    i = 0
    while i < len(lines):
        line = lines[i]
        m = ARRAY_START.match(line)
        if m:
            body, i = m.group(2), i + 1
            while _close_paren(body) < 0 and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            body = body[:max(_close_paren(body), 0)]
            arrays[m.group(1)] = [x for t in _split(body) for x in _expand(t, arrays, scalars)]
            continue
        i += 1
        if line.lstrip().startswith("#"):
            continue
        m = SCALAR.match(line)
        if m:
            value = _split(m.group(2))
            if len(value) == 1 and "$(" not in _subst(value[0], scalars):   # $((...)), $(cmd): not known
                scalars[m.group(1)] = _subst(value[0], scalars)
        tokens = _split(line)
        if len(tokens) >= 2 and tokens[0] in ("source", ".") and depth < 4:
            path = Path(_subst(tokens[1], scalars))
            path = path if path.is_absolute() or base is None else base / path
            if path.is_file():
                _read(path.read_text(encoding="utf-8"), path.parent, arrays, scalars, depth + 1)
            continue
        at = next((k for k, t in enumerate(tokens) if ENTRY.search(t)), None)
        if at is not None:
            args: list[str] = []
            for t in tokens[at + 1:]:
                if t in STOP_TOKENS:
                    break
                args += _expand(t, arrays, scalars)
            return Path(tokens[at]).name, args
    return None


def _close_paren(s: str) -> int:
    """Index of the first ``)`` of ``s`` outside quotes and comments; -1 when there is none."""
    quote, comment, prev = None, False, " "
    for k, c in enumerate(s):
        if comment:
            comment = c != "\n"
        elif quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and prev.isspace():
            comment = True
        elif c == ")":
            return k
        prev = c
    return -1


def _subst(token: str, scalars: dict) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced where the script gives them; others stay."""
    def one(m):
        name = m.group(1) or m.group(3)
        if name in scalars:
            return scalars[name]
        return m.group(2) if m.group(2) is not None and "$" not in m.group(2) else m.group(0)
    return VAR.sub(one, token)


def _expand(token: str, arrays: dict, scalars: dict) -> list[str]:
    m = SPLICE.match(token)
    if m:
        return list(arrays.get(m.group(1), []))
    value = _subst(token, scalars)
    return [value] if value or token == "" else []     # an empty variable expands to no word


def split_flags(argv: list[str]) -> list[tuple[str, list[str]]]:
    """[(flag, its values)] of an argument list (``--flag=value`` split); a value may start with '-' and a digit."""
    out: list[tuple[str, list[str]]] = []
    for a in argv:
        if a.startswith("--"):
            flag, eq, value = a.partition("=")
            out.append((flag, [value] if eq else []))
        elif out:
            out[-1][1].append(a)
        else:
            out.append((a, []))
    return out


def verdict(flag: str, known: set, flag_values: Optional[list] = None) -> tuple[str, str]:
    """(kind, what slick does) for one slime flag (module doc)."""
    if flag.startswith(("--sglang-", "--vllm-")):
        return "engine", ("an option of the SGLang/vLLM servers slick launches (slick's own engine honours "
                          "the few it has a meaning for and warns about the rest)")
    spelled = {f.flag: f for f in spellings.FLAGS}
    if flag in spelled:
        return "mapped", spelled[flag].help
    if flag == spellings.WARMUP_FRACTION:
        return "mapped", "--lr-warmup-steps = FRACTION x the decay steps"
    for kind, rows in (("accepted", {k: v for k, (_, v) in spellings.ALWAYS.items()}),
                       ("no-op", {k: v for k, (_, v) in spellings.NO_EFFECT.items()}),
                       ("refused", spellings.REFUSED)):
        if flag in rows:
            return kind, rows[flag]
    row = table.row(flag, flag_values)
    if row is not None:
        return row
    if flag in known:
        return "same", "slick's flag of the same name"
    return "refused", "unknown to slick"


def _command(entry: str, flags: list) -> str:
    sft = any(f == "--loss-type" and v == ["sft_loss"] for f, v in flags)
    if any(f == "--rollout-function-path" and v and v[0] in ROLLOUT_FUNCTIONS for f, v in flags):
        return "slick train-async"
    return "slick train-async" if entry == "train_async.py" and not sft else "slick train"


def to_slick(text: str, base: Optional[Path] = None) -> tuple[str, list[str]]:
    """(the slick command, its argument list) that runs the script ``text``: its arguments as they are."""
    entry, argv = read_script(text, base)
    return _command(entry, split_flags(argv)), argv


def check(text: str, base: Optional[Path] = None) -> tuple[list[str], int]:
    """The report's lines and the exit code for the script ``text`` (``base``: its directory, ``read_script``)."""
    entry, argv = read_script(text, base)
    known = set(build_parser()._option_string_actions)
    flags = split_flags(argv)
    sft = any(f == "--loss-type" and v == ["sft_loss"] for f, v in flags)
    command = _command(entry, flags)
    lines, refused, rest = [], 0, []
    for flag, values in flags:
        shown = " ".join([flag] + values)
        if flag == "--rollout-function-path" and values and values[0] in ROLLOUT_FUNCTIONS:
            kind, why = "mapped", ROLLOUT_FUNCTIONS[values[0]]
        else:
            kind, why = verdict(flag, known, values)
        if any("$" in v for v in values):     # set outside the script (or computed): not checked
            why += "; its value is set outside the script, so slick's parser does not check it"
        else:
            rest += [flag] + values
        refused += kind == "refused"
        lines.append(f"{kind:<9} {shown}: {why}")
    note = " (SFT generates nothing to overlap)" if entry == "train_async.py" and sft else ""
    head = [f"{entry} -> {command}{note}: {len(flags)} flags, {refused} refused"]
    problems, notes = _parse_problems(rest, known, "async" if command == "slick train-async" else "sync")
    tail = ["", "slick's parser on the whole list (no files read):"] + ([f"  {p}" for p in problems] or ["  ok"])
    tail += [f"  note: {n}" for n in notes]
    return head + lines + tail, 1 if refused or problems else 0


class _Notes(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record) -> None:
        self.lines.append(record.getMessage())


def _parse_problems(argv: list[str], known: set, driver: str) -> tuple[list[str], list[str]]:
    """(problems, warnings) of slick's parser on ``argv`` without opening files (unknown flags left out: each is
    listed as refused above)."""
    keep = [x for f, v in split_flags(argv) if f in known or f.startswith(("--sglang-", "--vllm-"))
            for x in [f] + v]
    notes, logger = _Notes(), logging.getLogger("slick.config")
    logger.addHandler(notes)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_config(keep, validate=False, driver=driver)
    except ConfigError as e:
        return list(e.problems), notes.lines
    except SystemExit:
        return [err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "argparse stopped"], \
            notes.lines
    finally:
        logger.removeHandler(notes)
    return [], notes.lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="slick slime-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="a slime launch script (bash)")
    args = parser.parse_args(argv)
    logging.getLogger("slick.config").propagate = False     # its warnings are part of the report
    try:
        path = Path(args.script)
        lines, code = check(path.read_text(encoding="utf-8"), path.resolve().parent)
    except (OSError, ScriptError) as e:
        print(f"slick slime-check: {args.script}: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return code

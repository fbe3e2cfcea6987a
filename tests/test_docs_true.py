"""Docs that are true: what README.md and docs/*.md state that a test can check.

* no machine load figures or dates in docs/*.md: measurements live in bench/results/, which records the machine,
  its load and the date; a doc cites the file (README.md may quote a load a results file records);
* every ``bench/results/...`` file named in README.md and docs/*.md exists, and so does every file in the README
  benchmark table's ``file`` column;
* every path into the package (``slick/...``, or room-relative such as ``engines/router.py``) and every dotted
  ``slick.x.y`` name exists: modules move between rooms (slick/ckpt, slick/weights, slick/proc, slick/configure);
* every ``--flag`` in docs/*.md is one a command of this repository takes (``slick train``'s parser from
  :func:`slick.configure.build_parser`, the other ``slick`` subcommands', the bench/examples/tests scripts'), a
  ``--sglang-*`` / ``--vllm-*`` pass-through, or another program's flag listed in :data:`OTHER_PROGRAMS`;
* README.md's ratios follow the one convention it states (:data:`RATIO_CONVENTION`), checked against the two
  numbers each ratio is printed beside.

Each checker is a function of the text; ``test_the_checkers_can_fail`` runs them on small bad examples.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

# ------------------------------------------------------------------------------------------------ load and dates
_LOAD = re.compile(r"load[ -]?averages?|loadavg|\bload\s*(?:of\s*|was\s*|[~≈]\s*)?\d", re.I)
_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def load_figures(text: str) -> list[str]:
    """Lines of ``text`` that state a machine load or a calendar date (``line N: ...``)."""
    return [f"line {i}: {line.strip()[:120]}" for i, line in enumerate(text.splitlines(), 1)
            if _LOAD.search(line) or _DATE.search(line)]


# ------------------------------------------------------------------------------------------- bench/results files
_RESULTS = re.compile(r"bench/results/([\w.{},*-]*\w[}*]?)")


def _expand(name: str) -> list[str]:
    """``scale.{json,md}`` -> ``scale.json``, ``scale.md``."""
    m = re.search(r"\{([^}]*)\}", name)
    if not m:
        return [name]
    return [x for alt in m.group(1).split(",") for x in _expand(name[:m.start()] + alt + name[m.end():])]


def _result_exists(name: str, root: Path) -> bool:
    d = root / "bench" / "results"
    # a name without a suffix is an --out prefix (`--out bench/results/scale_smollm2`): a file with that stem
    return (d / name).is_file() or (not Path(name).suffix and any(d.glob(name + ".*"))) or \
        ("*" in name and any(d.glob(name)))


def missing_results(text: str, root: Path = ROOT) -> list[str]:
    """``bench/results/...`` names in ``text`` with no such file."""
    return sorted({n for m in _RESULTS.finditer(text) for n in _expand(m.group(1)) if not _result_exists(n, root)})


def missing_table_results(readme: str, root: Path = ROOT) -> list[str]:
    """Files in the ``file`` column (the last) of README's benchmark table that are not in bench/results/."""
    out = []
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and "`" in cells[-1]:
            out += [n for n in re.findall(r"`([\w.-]+\.(?:md|json))`", cells[-1]) if not _result_exists(n, root)]
    return out


# -------------------------------------------------------------------------------------------- package paths, modules
def _rooms(root: Path) -> set[str]:
    return {p.name for p in (root / "slick").iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


_PATH = re.compile(r"(?<![\w./:@-])((?:slick/)?[a-z_]+/[\w/.-]*[\w])")
_SOURCE = (".py", ".cpp", ".h", ".js", ".html")   # a room-relative path names a source file (rollout/... is a metric)


def missing_paths(text: str, root: Path = ROOT) -> list[str]:
    """``slick/...`` paths, and source files named from their room (``engines/router.py``), in
    ``text`` that name no file or directory of the package (a module may be named without ``.py``)."""
    rooms, out = _rooms(root), []
    for m in _PATH.finditer(text):
        p = m.group(1).rstrip(".")
        if p.startswith("slick/"):
            path = root / p
        elif p.split("/")[0] in rooms and p.endswith(_SOURCE):
            path = root / "slick" / p
        else:
            continue
        if not (path.exists() or path.with_name(path.name + ".py").exists()):
            out.append(p)
    return sorted(set(out))


_DOTTED = re.compile(r"(?<![\w./-])(slick(?:\.[A-Za-z_]\w*)+)")


def missing_modules(text: str, root: Path = ROOT) -> list[str]:
    """Dotted ``slick.x.y[.attr]`` names in ``text``: the longest prefix must be a module of the package and the
    rest attributes of it (``slick.rollout.sft.generate_rollout``)."""
    out = []
    for m in _DOTTED.finditer(text):
        parts = m.group(1).split(".")
        k = len(parts)
        while k > 1 and not ((root / Path(*parts[:k])).with_suffix(".py").is_file()
                             or (root / Path(*parts[:k]) / "__init__.py").is_file()):
            k -= 1
        if k == 1:
            out.append(m.group(1))
            continue
        if k < len(parts) and root == ROOT:
            try:
                obj = importlib.import_module(".".join(parts[:k]))
                for a in parts[k:]:
                    obj = getattr(obj, a)
            except (ImportError, AttributeError):
                out.append(m.group(1))
    return sorted(set(out))


# ------------------------------------------------------------------------------------------------------- flags
# Flags of programs other than this repository's that the docs quote (the commands they show, or the options slick
# passes when it launches them). Grouped by program; a flag of slick's own belongs in a parser, never here.
OTHER_PROGRAMS = {
    "ray start / ray job submit": {"--head", "--address", "--node-ip-address", "--num-cpus", "--dashboard-host",
                                   "--runtime-env-json"},
    "bubblewrap (bwrap)": {"--unshare-all", "--die-with-parent", "--block-fd"},
    "SGLang's launch_server": {"--tp", "--disable-radix-cache", "--grammar-backend", "--max-total-tokens",
                               "--mem-fraction-static", "--skip-server-warmup", "--sleep-on-idle", "--random-seed",
                               "--weight-version", "--enable-lora", "--max-lora-rank", "--lora-backend"},
    "sglang-router": {"--worker-urls", "--policy"},
    "vllm serve": {"--max-loras", "--max-num-seqs", "--max-logprobs", "--logprobs-mode", "--enable-scale-out",
                   "--structured-outputs-config", "--middleware"},
    "torch.distributed": {"--master-addr"},
    "tensorboard": {"--logdir"},
    "git worktree remove": {"--force"},
}
PASS_THROUGH = ("--sglang-", "--vllm-")   # slick train hands these to the engines it launches (configure/parse.py)
# a flag; ``--sglang-*`` / ``--sglang-KEY`` name the pass-through (the match keeps the trailing ``-``)
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?:-(?=\*|[A-Z]))?")


class _Parsed(Exception):
    pass


@lru_cache(maxsize=1)
def known_flags() -> frozenset:
    """Every option string of ``slick train`` (build_parser) and of each other ``slick`` subcommand (their parsers
    caught as they parse), plus the ``add_argument("--...")`` literals of the package's, bench's, examples' and
    tests' scripts."""
    from slick.cli import COMMANDS
    from slick.configure import build_parser

    flags = set(build_parser()._option_string_actions)

    def caught(self, *a, **k):
        flags.update(self._option_string_actions)
        raise _Parsed

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", caught)
        mp.setattr(argparse.ArgumentParser, "parse_known_args", caught)
        for module, _ in COMMANDS.values():
            with contextlib.suppress(_Parsed), contextlib.redirect_stdout(io.StringIO()):
                importlib.import_module(module).main([])
    for d in ("slick", "bench", "examples", "tests"):
        for p in (ROOT / d).rglob("*.py"):
            flags.update(re.findall(r"""add_argument\(\s*["'](--[\w-]+)""", p.read_text()))
    return frozenset(flags)


def unknown_flags(text: str, known: frozenset) -> list[str]:
    other = set().union(*OTHER_PROGRAMS.values())
    return sorted({f for f in _FLAG.findall(text) if f not in known and f not in other
                   and not f.startswith(PASS_THROUGH)})


# ------------------------------------------------------------------------------------------------------- ratios
RATIO_CONVENTION = "Every ratio in this table is a speed-up"
_UNIT = r"(s|MiB|tok/s|completions/s)"
_RATIO = re.compile(r"([\d,]+(?:\.\d+)?) ?" + _UNIT + r"? vs ([\d,]+(?:\.\d+)?) ?" + _UNIT
                    + r" \((?:\*\*)?(?:TRL uses )?(\d+\.\d+)x")


def ratio_problems(text: str) -> list[str]:
    """``A <unit> vs B <unit> (R x`` where R is not the convention's ratio: times and memory B / A (the second
    side's over the first's), throughputs A / B; within 1% (the ratios come from unrounded means)."""
    out = []
    for m in _RATIO.finditer(text):
        a, b = (float(m.group(i).replace(",", "")) for i in (1, 3))
        unit, r = m.group(4), float(m.group(5))
        want = a / b if unit.endswith("/s") else b / a
        if abs(r - want) > 0.01 * want:
            out.append(f"{m.group(0)}: expected {want:.2f}x")
    return out


# ------------------------------------------------------------------------------------------------------ the tests
def _docs():
    return [(p.name, p.read_text()) for p in DOCS]


def test_docs_carry_no_load_figures_or_dates():
    bad = {name: load_figures(text) for name, text in _docs()}
    assert not {k: v for k, v in bad.items() if v}, "cite the bench/results file that records the machine instead"


def test_named_bench_results_exist():
    texts = [("README.md", README.read_text())] + _docs()
    bad = {name: missing_results(text) for name, text in texts}
    assert not {k: v for k, v in bad.items() if v}
    assert missing_table_results(README.read_text()) == []


def test_named_package_paths_and_modules_exist():
    texts = [("README.md", README.read_text())] + _docs()
    bad = {name: missing_paths(text) + missing_modules(text) for name, text in texts}
    assert not {k: v for k, v in bad.items() if v}


def test_flags_in_docs_are_real():
    known = known_flags()
    assert "--hf-checkpoint" in known and "--lora-adapter" in known   # slick train's and slick export's
    assert not set().union(*OTHER_PROGRAMS.values()) & known, "a flag of slick's own is listed as another program's"
    bad = {name: unknown_flags(text, known) for name, text in _docs()}
    assert not {k: v for k, v in bad.items() if v}


def test_readme_ratios_follow_its_convention():
    text = README.read_text()
    assert RATIO_CONVENTION in text
    assert len(_RATIO.findall(text)) >= 5          # the check reads the rows it is meant to
    assert ratio_problems(text) == []


def test_the_checkers_can_fail(tmp_path):
    assert load_figures("Measured on 2 cores (load average 1.2).\nfine") == \
        ["line 1: Measured on 2 cores (load average 1.2)."]
    assert load_figures("alone (load 0.97)") and load_figures("ran 2026-11-23 08:01") and not load_figures("loads")
    assert missing_results("see `bench/results/no_such_file.md` and bench/results/vs_trl.md") == \
        ["no_such_file.md"]
    assert missing_results("bench/results/scaleout.{json,nope}") == ["scaleout.nope"]
    assert missing_table_results("| a | b | c | d | `vs_trl.md`, `gone.json` |") == ["gone.json"]
    assert missing_paths("`slick/train/checkpoint.py` is `slick/ckpt/checkpoint.py`; `slick/train/transport`, "
                         "`train/transport.py`, `weights/transport/disk.py`, `rollout/raw_reward`") == \
        ["slick/train/checkpoint.py", "slick/train/transport", "train/transport.py"]
    assert missing_modules("`slick.config.validate` and `slick.configure.validate`, `slick.loop.sync.nope`") == \
        ["slick.config.validate", "slick.loop.sync.nope"]
    assert unknown_flags("`--hf-checkpoint`, `--sglang-mem-fraction-static`, `--vllm-*`, `--no-such-flag`",
                         frozenset({"--hf-checkpoint"})) == ["--no-such-flag"]
    assert ratio_problems("98.6 s vs 1,055 s (**10.70x**); 883 vs 302 tok/s (**2.93x**)") == []
    assert ratio_problems("98.6 s vs 1,055 s (**0.09x**)") and ratio_problems("883 vs 302 tok/s (0.34x)")
    assert ratio_problems("3,167 vs 6,742 MiB (TRL uses 2.50x slick's)")

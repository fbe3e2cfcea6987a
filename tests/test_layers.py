"""The rooms of slick/ and their order, as the import-linter contract in pyproject.toml states them.

`lint-imports` (import-linter, run as the venv's own program) must keep both contracts: every room imports only
the rooms below it, and no modules import each other in a cycle. The same contract run on a copy of the package
with one upward import, or one cycle, injected must fail and name it, so these tests can fail. tests/import_graph.py
counts the same graph by itself: 0 cycles, 0 upward imports, and no function-local import of a slick module
without a reason given in a comment.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import import_graph

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# The function-local imports of slick modules that remain, each with its reason in a comment beside it.
IMPORT_COST = {
    ("slick.configure.validate", "slick.algo.inputs"),   # torch: `import slick.configure` stays free of it
    ("slick.configure.autoplan", "slick.train.precision"),   # torch, only when a micro-batch budget is sized
    ("slick.configure.lora", "slick.train.lora"),        # torch and PEFT, only when a run asks for LoRA
    ("slick.cli", "slick.config"),                    # after the tcmalloc re-exec
    ("slick.demo.__main__", "slick.loop.sync"),       # torch, after the tcmalloc re-exec
    ("slick.demo.__main__", "slick.observe.plot"),    # matplotlib, likewise
    ("slick.demo.__main__", "slick.demo.agent"),
    ("slick.demo.__main__", "slick.demo.sft"),
    ("slick.demo.__main__", "slick.demo.distill"),
    ("slick.demo.__main__", "slick.demo.moe"),
    ("slick.observe", "slick.observe.metrics"),       # the package's lazy names
    ("slick.observe", "slick.observe.progress"),
    ("slick.observe", "slick.rollout.passk"),
    ("slick.observe", "slick.observe.plot"),
}


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on ``root``'s pyproject.toml, importing ``slick`` from ``root`` (no cache written)."""
    assert LINT_IMPORTS.is_file(), f"{LINT_IMPORTS} missing: pip install -e '.[dev]' installs import-linter"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo", str(root / "pyproject.toml")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def package_copy(tmp_path) -> Path:
    """slick/ and pyproject.toml copied into a fresh directory, to break on purpose."""
    shutil.copytree(ROOT / "slick", tmp_path / "slick", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def inject(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}  # injected by tests/test_layers.py\n")


def test_contract_kept():
    out = lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rooms: each imports only the rooms below it KEPT" in out.stdout
    assert "no import cycles KEPT" in out.stdout
    assert "Contracts: 2 kept, 0 broken." in out.stdout


def test_contract_layers_every_room():
    """Every package and top-level module of slick/ is in exactly one layer, so nothing escapes the contract."""
    rooms = [r for layer in import_graph.layers(ROOT) for r in layer]
    assert len(rooms) == len(set(rooms))
    present = {f"slick.{p.stem if p.is_file() else p.name}" for p in (ROOT / "slick").iterdir()
               if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert set(rooms) == present


def test_graph_counts():
    numbers = import_graph.report(ROOT, verbose=False)
    assert numbers["cycles"] == 0
    assert numbers["upward_imports"] == 0
    assert numbers["function_local_imports"] == 0
    assert numbers["function_local_optional_dep"] == 0
    graph = import_graph.build(ROOT)
    cost = {(i.source, i.target) for i in import_graph.local_imports(graph)["import_cost"]}
    assert cost == IMPORT_COST


def test_upward_import_breaks_contract(package_copy):
    # the bottom layer's fastmath importing chat (three layers up), which depends on nothing of fastmath: no cycle
    inject(package_copy / "slick" / "fastmath.py", "from slick.chat import safejson")
    out = lint_imports(package_copy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "rooms: each imports only the rooms below it BROKEN" in out.stdout
    assert "slick.fastmath -> slick.chat.safejson" in out.stdout
    assert "no import cycles KEPT" in out.stdout
    numbers = import_graph.report(package_copy, verbose=False)
    assert (numbers["upward_imports"], numbers["cycles"]) == (1, 0)


def test_upward_import_into_a_cycle_breaks_both(package_copy):
    inject(package_copy / "slick" / "chat" / "delta.py", "from slick.loop import run")
    out = lint_imports(package_copy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "rooms: each imports only the rooms below it BROKEN" in out.stdout
    assert "slick.chat.delta -> slick.loop.run" in out.stdout
    assert "no import cycles BROKEN" in out.stdout


def test_cycle_breaks_contract(package_copy):
    inject(package_copy / "slick" / "chat" / "safejson.py", "from slick.chat import delta")
    inject(package_copy / "slick" / "chat" / "delta.py", "from slick.chat import safejson")
    out = lint_imports(package_copy)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no import cycles BROKEN" in out.stdout
    assert "rooms: each imports only the rooms below it KEPT" in out.stdout
    numbers = import_graph.report(package_copy, verbose=False)
    assert (numbers["cycles"], numbers["upward_imports"]) == (1, 0)
    assert import_graph.cycles(import_graph.build(package_copy)) == [["slick.chat.delta", "slick.chat.safejson"]]


def test_unexplained_function_local_import_counted(package_copy):
    late = "def _late():\n    from slick.types import Sample\n    return Sample"
    inject(package_copy / "slick" / "engine" / "local.py", late)
    assert import_graph.report(package_copy, verbose=False)["function_local_imports"] == 1

"""Config reads are typed: outside ``slick/config`` and ``slick/configure``

(a) every function or method parameter named ``cfg`` is annotated with what it takes (``Config``, ``ConfigView``,
    or one group's dataclass, e.g. ``TrainConfig``);
(b) no ``getattr(cfg, "field", default)`` (nor on ``args`` or ``<anything>.cfg``): a field's default lives in
    ``slick/config/groups.py`` only, and a field the config lacks must fail loudly, not read a second default.

An AST walk over slick/**/*.py finds both; every offender is named by file:line.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLICK = ROOT / "slick"
EXCLUDED = ("slick/config/", "slick/configure/")   # the config types themselves, and parsing/validation
CONFIG_NAMES = ("cfg", "args")                      # names under which slick code holds a Config or a view



def _holds_config(node: ast.expr) -> bool:
    """``cfg``, ``args`` or ``<expr>.cfg``."""
    return ((isinstance(node, ast.Name) and node.id in CONFIG_NAMES)
            or (isinstance(node, ast.Attribute) and node.attr == "cfg"))


def offenders(source: str) -> list[tuple[int, str]]:
    """(line, what) for every unannotated ``cfg`` parameter and every ``getattr(<config>, "name", default)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.arg == "cfg" and arg.annotation is None:
                    found.append((arg.lineno, f"parameter 'cfg' of {node.name}() has no annotation"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) == 3 and _holds_config(node.args[0])
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.append((node.lineno, f"getattr({ast.unparse(node.args[0])}, {node.args[1].value!r}, default): "
                                       "read the field (its default is in slick/config/groups.py)"))
    return sorted(found)


def _scan() -> list[tuple[str, int, str, str]]:
    """(file, line, line text, what) over slick/, the excluded packages left out."""
    out = []
    for path in sorted(SLICK.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(EXCLUDED):
            continue
        source = path.read_text()
        lines = source.splitlines()
        out += [(rel, n, lines[n - 1].strip(), what) for n, what in offenders(source)]
    return out


def test_config_reads_are_typed():
    found = _scan()
    new = [f"{f}:{n}: {what}: {text}" for f, n, text, what in found]
    assert not new, "untyped config reads (annotate the parameter / read the field):\n" + "\n".join(new)


def test_the_walker_flags_injected_offenders():
    source = '''
from slick.config import Config

def ok(cfg: Config, x):
    return cfg.lr, getattr(cfg, "lr"), getattr(x, "lr", 1), getattr(cfg, name, 1)

def bare(cfg, x: int):
    return cfg.lr

class A:
    async def method(self, *, cfg=None):
        return getattr(self.cfg, "tool_parser", "hermes")

def plugin(args, sample):
    return getattr(args, "reward_key", None)
'''
    assert offenders(source) == [
        (7, "parameter 'cfg' of bare() has no annotation"),
        (11, "parameter 'cfg' of method() has no annotation"),
        (12, "getattr(self.cfg, 'tool_parser', default): read the field (its default is in slick/config/groups.py)"),
        (15, "getattr(args, 'reward_key', default): read the field (its default is in slick/config/groups.py)"),
    ]

"""Measure slick's import graph: cycles, upward imports between rooms, function-local imports.

Run: `.venv/bin/python tests/import_graph.py` (prints the three numbers and each finding).
tests/test_layers.py imports it to hold the numbers at zero; the layering itself is the import-linter
contract in pyproject.toml ([tool.importlinter]), which this script reads so the two never disagree.

Read statically with `ast` (nothing is imported):
- an import is *function-local* when it sits inside a function body (a `def` / `async def` / lambda);
  imports under `if TYPE_CHECKING:` never run and are left out of every count;
- a *cycle* is a strongly connected component of more than one module in the graph of all imports,
  function-local ones included (a function-local import only hides a cycle; grimp, under import-linter,
  sees it too);
- an *upward import* is a module-level or function-local import from a room to a room above it in the
  contract's layers (rooms in one layer separated by `|` are independent: an import between them counts too);
- a *function-local import* is one inside a function body that names a slick module. Those the code explains
  with a comment in the function before it (or on its line) are counted apart, by reason: "optional dependency:"
  (the module needs Ray, vLLM, openai...) or "import cost:" (a light module must not load torch, matplotlib...).
"""
from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "slick"
MARKS = {"optional dependency:": "optional_dep", "import cost:": "import_cost"}


@dataclass
class Import:
    source: str        # importing module, e.g. "slick.loop.run"
    target: str        # imported module, e.g. "slick.train.trainer"
    line: int
    local: bool        # inside a function body
    type_checking: bool
    reason: str        # "" or the MARKS value its comment gives (function-local imports only)


@dataclass
class Graph:
    modules: set[str] = field(default_factory=set)
    imports: list[Import] = field(default_factory=list)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(source: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(source: str, is_package: bool, node: ast.AST, modules: set[str]) -> list[str]:
    """The slick modules an import statement names (the deepest existing module of each name)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = _resolve(source, is_package, node)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] == PACKAGE and name not in out:
            out.append(name)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def build(root: Path = ROOT, package: str = PACKAGE) -> Graph:
    files = sorted((root / package).rglob("*.py"))
    graph = Graph(modules={_module_name(f, root) for f in files})
    for f in files:
        source = _module_name(f, root)
        is_package = f.name == "__init__.py"
        text = f.read_text()
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(f))

        def reason(start: int, line: int) -> str:
            """The MARKS reason of a comment between the function's first line and the import's line."""
            for text in [lines[line - 1]] + [t for t in lines[start - 1:line - 1] if t.strip().startswith("#")]:
                comment = text.partition("#")[2]
                for mark, why in MARKS.items():
                    if mark in comment:
                        return why
            return ""

        def visit(node: ast.AST, func_start: int, tc: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    why = reason(func_start, child.lineno) if func_start else ""
                    for target in _targets(source, is_package, child, graph.modules):
                        if target != source:
                            graph.imports.append(Import(source, target, child.lineno, bool(func_start), tc, why))
                is_func = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                inner_start = func_start or (child.lineno if is_func else 0)
                inner_tc = tc or (isinstance(child, ast.If) and _is_type_checking(child.test))
                visit(child, inner_start, inner_tc)

        visit(tree, 0, False)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components (> 1 module) of the import graph (Tarjan, iterative)."""
    edges: dict[str, set[str]] = {m: set() for m in graph.modules}
    for imp in graph.imports:
        if not imp.type_checking:
            edges[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def layers(root: Path = ROOT) -> list[list[str]]:
    """The contract's layers, highest first, each a list of independent rooms (from pyproject.toml)."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    contracts = config.get("tool", {}).get("importlinter", {}).get("contracts", [])
    for contract in contracts:
        if contract.get("type") == "layers":
            out = []
            for layer in contract["layers"]:
                rooms = [r.strip().strip("()") for r in layer.replace(":", "|").split("|")]
                out.append([f"{contract.get('containers', [PACKAGE])[0]}.{r}" if not r.startswith(PACKAGE)
                            else r for r in rooms if r])
            return out
    return []


def room_of(module: str, rooms: list[str]) -> str | None:
    for room in rooms:
        if module == room or module.startswith(room + "."):
            return room
    return None


def upward(graph: Graph, order: list[list[str]]) -> list[Import]:
    """Imports from a room to a room above it, or to a sibling room in the same layer."""
    rank = {room: i for i, layer in enumerate(order) for room in layer}  # 0 = highest
    rooms = sorted(rank, key=len, reverse=True)
    out = []
    for imp in graph.imports:
        if imp.type_checking:
            continue
        a, b = room_of(imp.source, rooms), room_of(imp.target, rooms)
        if a is None or b is None or a == b:
            continue
        if rank[b] < rank[a] or (rank[b] == rank[a]):
            out.append(imp)
    return out


def local_imports(graph: Graph) -> dict[str, list[Import]]:
    """Function-local imports of slick modules by reason: "" (none given), "optional_dep", "import_cost"."""
    out: dict[str, list[Import]] = {"": [], **{why: [] for why in MARKS.values()}}
    for i in graph.imports:
        if i.local and not i.type_checking:
            out[i.reason].append(i)
    return out


def _statements(imports: list[Import]) -> list[Import]:
    """One entry per import statement (an import naming two modules counts once)."""
    seen, out = set(), []
    for i in imports:
        if (i.source, i.line) not in seen:
            seen.add((i.source, i.line))
            out.append(i)
    return out


def report(root: Path = ROOT, verbose: bool = True) -> dict[str, int]:
    graph = build(root)
    cyc = cycles(graph)
    up = upward(graph, layers(root))
    local = local_imports(graph)
    unmarked = local[""]
    numbers = {"modules": len(graph.modules), "cycles": len(cyc), "upward_imports": len(_statements(up)),
               "function_local_imports": len(_statements(unmarked)),
               **{f"function_local_{why}": len(_statements(local[why])) for why in MARKS.values()}}
    if verbose:
        for c in cyc:
            print("cycle:", " <-> ".join(c))
        for i in _statements(up):
            print(f"upward: {i.source}:{i.line} -> {i.target}{' (function-local)' if i.local else ''}")
        for i in _statements(unmarked):
            print(f"function-local: {i.source}:{i.line} -> {i.target}")
        print(" ".join(f"{k}={v}" for k, v in numbers.items()))
    return numbers


if __name__ == "__main__":
    report(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)

"""The rooms one sample's training passes through, from ``Run.train`` to the loss (issue 53), measured statically.

Run: ``.venv/bin/python tests/room_path.py [ROOT]`` (prints the path, its numbers and the other issue-53 measures:
lines of slick/loop/step.py, fields of the run's parts dataclasses, untyped config reads); importable
(``from tests import room_path``; :func:`measure` returns everything it prints).

*Rooms* are slick's top-level packages and modules (slick/loop, slick/train, slick/algo...), ordered top to bottom
by the import-linter ``layers`` contract in pyproject.toml (read with ``tests/import_graph.py``; rooms of one layer,
``a | b``, are side by side: a move between them is *sideways*, neither up nor down).

The walk (``ast`` only: nothing is imported or run)
---------------------------------------------------
It starts at ``slick.loop.run.Run.train`` and goes depth first through the calls each function makes, in source
order, entering every function once. It enters the loss functions (:data:`TARGETS`) but not what they call. It
does not stop the first time it gets there: it covers all of ``Run.train`` (e.g. ``store_step`` and the debug dump
after training). A call is resolved to a slick function when its callee is

- a name defined in the module or imported into it (``from slick.x.y import f``; re-exports through a package's
  ``__init__`` are followed), or ``mod.f`` of an imported module;
- ``Cls(...)``: the class's ``__init__`` (or a dataclass's ``__post_init__``; a class with neither is a leaf, named
  by the class); ``Cls.m(...)``: its method;
- ``x.m(...)`` / ``x(...)`` (``__call__``) where the walk knows ``x``'s class from: a parameter's annotation (``X``,
  ``X | None``, ``Optional[X]``, a string); an unannotated parameter named in :data:`PARAM_TYPES`; a local assigned
  from a constructor or from a function whose return annotation names a slick class (tuples unpacked); ``self``;
  or ``self.<attr>``. For ``self.<attr>`` it tries :data:`ATTR_TYPES` first, then the class's annotated fields,
  then ``self.<attr> = ...`` in ``__init__``. For the classes in :data:`DELEGATING` (``Run``) it also tries the
  attributes of the class's parts. Methods are looked up along the slick base classes. A type that names a
  protocol is read as the implementation in :data:`IMPLEMENTATIONS`;
- one of the few dynamic calls written down in :data:`DYNAMIC` (the trainer's ``objective(inputs)``, the
  advantage estimator, ``WholeBatchLoss``'s loss), each with what the default configuration binds there.

What it does not resolve. It lists the unresolved calls that name a method some slick class defines:

- any other dynamic dispatch: attributes typed ``Any`` or not typed at all (``self.moe``, ``self.lora``...);
- the Ray trainer. :data:`IMPLEMENTATIONS` and the tables name the in-process ``slick.train.trainer.Trainer``, so
  ``trainer.train_step`` never goes through ``slick.cluster.trainer_group`` or a Ray actor;
- other objectives and estimators: plug-ins (``--custom-loss-function-path``, ``--custom-advantage-function-path``,
  ``--rollout-function-path``) and non-default estimators;
- callables kept in variables or containers (``self._fwd``, ``cut`` in ``TrainBatch._map``, ``getattr(...)``),
  ``super()``, and calls made by torch or the standard library back into slick.

A function is entered once: a later call to it (maybe with other arguments) is counted, but its body is not walked
again. Both branches of every ``if`` are walked, whatever the config says.

*The sample's path* is the part of the walk that carries the sample. In ``Run.train`` the name ``groups`` holds it.
A local assigned from an expression that mentions a carrying name carries it too (``samples``, ``batch``,
``part``...). A call is on the path when one of its arguments, or the object its method is called on, mentions a
carrying name; in the callee, the parameters those arguments bind carry it. What a loss function returns carries
nothing. The three numbers are counted over the path's calls, each distinct caller -> callee pair once:

(a) *moves*: calls from a function in room A to a function in room B != A;
(b) *moves back up*: those where B is above A in the layer order;
(c) *entries into slick/loop/step.py*: calls from outside that file to a function in it.

It also prints the same numbers for the whole walk (every resolved call, whether it carries the sample or not).
The issue's targets: at most 10 moves, at most 3 back up.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__" and str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import import_graph  # noqa: E402
from tests import test_config_typed  # noqa: E402

PACKAGE = "slick"
START = "slick.loop.run.Run.train"
STEP_MODULE = "slick.loop.step"
PARTS_MODULES = ("slick.loop.build", "slick.loop.parts")   # Components, or the groups it was split into
MAX_MOVES, MAX_UP = 10, 3   # the targets

# The loss functions: the walk enters them and stops there.
TARGETS = {
    "slick.algo.objective.compute_policy_objective",   # the policy objective (objective_from_config's default)
    "slick.algo.sft.sft_objective",                    # --loss-type sft_loss
    "slick.train.critic._value_loss",                  # the critic's value loss (value_objective)
    "slick.algo.value.value_loss",
}

# A type naming a protocol is walked as this implementation (the loop types its trainer as the protocol).
IMPLEMENTATIONS = {"slick.train.protocol.Trainer": "slick.train.trainer.Trainer"}   # in-process; not the Ray group
# self.<attr> whose type the code does not state (fields typed Any): (class name, attribute) -> the classes to
# take, the first one that exists. A class name, not its module: the parts' classes move between modules.
_TRAINER, _CRITIC = "slick.train.trainer.Trainer", "slick.train.critic.Critic"   # Critic: PPO's value model
ATTR_TYPES = {
    ("Components", "trainer"): [_TRAINER],
    ("Components", "critic"): [_CRITIC, _TRAINER],
    ("Components", "store"): ["slick.observe.store.RolloutStore"],
}
# Classes whose attributes come from their parts: an attribute the class does not define is looked up on each of
# its typed attributes (``Run``: its part groups, or ``self.parts`` read through ``Run.__getattr__``).
DELEGATING = {"Run"}
# Unannotated parameters (slick/loop/step.py and slick/train/critic.py take the trainer and critic untyped).
PARAM_TYPES = {"trainer": [_TRAINER], "critic": [_CRITIC, _TRAINER]}
# Dynamic calls: (function, callee as written) -> the functions the default configuration binds there.
DYNAMIC = {
    # the trainer's objective: objective_from_config (slick/algo/assemble.py) binds compute_policy_objective
    # (sft_objective with --loss-type sft_loss); on the critic, value_objective binds _value_loss
    ("slick.train.trainer.Trainer.forward_backward", "objective"):
        ["slick.algo.objective.compute_policy_objective", "slick.train.critic._value_loss"],
    # WholeBatchLoss wraps the policy objective (slick/loop/step.py without_zero_gradients)
    ("slick.algo.objective.WholeBatchLoss.__call__", "self.loss_fn"): ["slick.algo.objective.compute_policy_objective"],
    # --advantage-estimator's default, grpo (slick.algo.estimators.ESTIMATORS)
    ("slick.algo.assemble.Advantages.compute", "self.estimator"): ["slick.algo.grpo.grpo"],
}


# ----------------------------------------------------------------------------------------------- the index
@dataclass
class ClassInfo:
    qualname: str
    module: str
    node: ast.ClassDef
    methods: dict[str, ast.AST] = field(default_factory=dict)
    fields: dict[str, ast.expr] = field(default_factory=dict)   # class-level annotations
    bases: list[str] = field(default_factory=list)


@dataclass
class FuncInfo:
    qualname: str
    module: str
    cls: Optional[str]
    node: ast.AST


@dataclass
class Module:
    name: str
    tree: ast.Module
    defs: dict[str, str] = field(default_factory=dict)        # top-level name -> qualname (function or class)
    imports: dict[str, tuple] = field(default_factory=dict)   # alias -> ("module", m) | ("symbol", m, name)


class Index:
    """Every slick module's top-level functions, classes (methods, annotated fields, bases) and imports."""

    def __init__(self, root: Path = ROOT):
        self.modules: dict[str, Module] = {}
        self.classes: dict[str, ClassInfo] = {}
        self.funcs: dict[str, FuncInfo] = {}
        files = sorted((root / PACKAGE).rglob("*.py"))
        for f in files:
            name = import_graph._module_name(f, root)
            self.modules[name] = Module(name, ast.parse(f.read_text(), filename=str(f)))
            self.modules[name].is_package = f.name == "__init__.py"
        for mod in self.modules.values():
            self._read(mod)
        for cls in self.classes.values():
            cls.bases = [b for b in (self.type_of_annotation(x, cls.module) for x in cls.node.bases) if b]

    def _read(self, mod: Module) -> None:
        for node in mod.tree.body:
            self._read_imports(mod, node)
            if isinstance(node, ast.If):   # `if TYPE_CHECKING:` / optional imports at module level
                for sub in node.body + node.orelse:
                    self._read_imports(mod, sub)
            if isinstance(node, ast.Try):
                for sub in node.body:
                    self._read_imports(mod, sub)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{mod.name}.{node.name}"
                mod.defs[node.name] = q
                self.funcs[q] = FuncInfo(q, mod.name, None, node)
            elif isinstance(node, ast.ClassDef):
                q = f"{mod.name}.{node.name}"
                mod.defs[node.name] = q
                info = ClassInfo(q, mod.name, node)
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        info.methods[item.name] = item
                        self.funcs[f"{q}.{item.name}"] = FuncInfo(f"{q}.{item.name}", mod.name, q, item)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        info.fields[item.target.id] = item.annotation
                self.classes[q] = info

    def _read_imports(self, mod: Module, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == PACKAGE:
                    if a.asname:
                        mod.imports[a.asname] = ("module", a.name)
                    else:
                        mod.imports[a.name.split(".")[0]] = ("module", PACKAGE)
        elif isinstance(node, ast.ImportFrom):
            base = import_graph._resolve(mod.name, getattr(mod, "is_package", False), node)
            if base.split(".")[0] != PACKAGE:
                return
            for a in node.names:
                alias = a.asname or a.name
                sub = f"{base}.{a.name}"
                mod.imports[alias] = ("module", sub) if sub in self.modules else ("symbol", base, a.name)

    # ------------------------------------------------------------------------------------ name resolution
    def symbol(self, module: str, name: str, depth: int = 0) -> Optional[tuple[str, str]]:
        """``name`` as seen from ``module``: ("func"|"class", qualname), ("module", module) or None."""
        mod = self.modules.get(module)
        if mod is None or depth > 10:
            return None
        if name in mod.defs:
            q = mod.defs[name]
            return ("class", q) if q in self.classes else ("func", q)
        imp = mod.imports.get(name)
        if imp is None:
            return ("module", f"{module}.{name}") if f"{module}.{name}" in self.modules else None
        if imp[0] == "module":
            return ("module", imp[1])
        return self.symbol(imp[1], imp[2], depth + 1)

    def type_of_annotation(self, ann: Optional[ast.expr], module: str) -> Optional[str]:
        """The slick class an annotation names (``X``, ``X | None``, ``Optional[X]``, ``"X"``), else None."""
        if ann is None:
            return None
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                return self.type_of_annotation(ast.parse(ann.value, mode="eval").body, module)
            except SyntaxError:
                return None
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
            return self.type_of_annotation(ann.left, module) or self.type_of_annotation(ann.right, module)
        if isinstance(ann, ast.Subscript) and _dotted(ann.value) in ("Optional", "typing.Optional"):
            return self.type_of_annotation(ann.slice, module)
        sym = self.dotted_symbol(ann, module)
        return IMPLEMENTATIONS.get(sym[1], sym[1]) if sym and sym[0] == "class" else None

    def tuple_annotation(self, ann: Optional[ast.expr], module: str) -> Optional[list[Optional[str]]]:
        """The element classes of a ``tuple[A, B, ...]`` return annotation."""
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            try:
                ann = ast.parse(ann.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(ann, ast.Subscript) and _dotted(ann.value) in ("tuple", "Tuple", "typing.Tuple"):
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            return [self.type_of_annotation(e, module) for e in elts]
        return None

    def dotted_symbol(self, node: ast.expr, module: str) -> Optional[tuple[str, str]]:
        """A Name or a chain of attributes over imported modules: ``f``, ``mod.f``, ``pkg.mod.Cls``."""
        if isinstance(node, ast.Name):
            return self.symbol(module, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted_symbol(node.value, module)
            if base and base[0] == "module":
                return self.symbol(base[1], node.attr)
        return None

    def mro(self, cls: str) -> list[str]:
        out, todo = [], [cls]
        while todo:
            c = todo.pop(0)
            if c in self.classes and c not in out:
                out.append(c)
                todo.extend(self.classes[c].bases)
        return out

    def method(self, cls: str, name: str) -> Optional[str]:
        for c in self.mro(cls):
            if name in self.classes[c].methods:
                return f"{c}.{name}"
        return None

    def constructor(self, cls: str) -> str:
        """What ``Cls(...)`` runs: ``__init__``, else ``__post_init__``, else the class itself (a leaf)."""
        return self.method(cls, "__init__") or self.method(cls, "__post_init__") or cls

    def attr_type(self, cls: str, attr: str, seen: frozenset = frozenset()) -> Optional[str]:
        """The class of ``self.<attr>`` on an instance of ``cls``."""
        if (cls, attr) in seen:
            return None
        seen = seen | {(cls, attr)}
        for c in self.mro(cls):
            short = c.rpartition(".")[2]
            if (short, attr) in ATTR_TYPES:
                return self.first_class(ATTR_TYPES[(short, attr)])
            info = self.classes[c]
            if attr in info.fields:
                t = self.type_of_annotation(info.fields[attr], info.module)
                if t:
                    return t
            init = info.methods.get("__init__")
            if init is not None:
                env = self.param_types(FuncInfo(f"{c}.__init__", info.module, c, init))
                for node in ast.walk(init):
                    if isinstance(node, (ast.Assign, ast.AnnAssign)):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for t in targets:
                            if (isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                                    and t.value.id == "self"):
                                got = (self.type_of_annotation(node.annotation, info.module)
                                       if isinstance(node, ast.AnnAssign) else None)
                                got = got or (self.expr_type(node.value, FuncInfo(f"{c}.__init__", info.module, c,
                                                                                  init), env, seen)
                                              if node.value is not None else None)
                                if got:
                                    return got
        if cls.rpartition(".")[2] in DELEGATING:   # an attribute of one of its parts
            for own in self.own_attrs(cls):
                holder = self.attr_type(cls, own, seen)
                got = holder and holder != cls and self.attr_type(holder, attr, seen)
                if got:
                    return got
        return None

    def own_attrs(self, cls: str) -> list[str]:
        """The attributes ``cls`` declares: annotated fields, then ``self.<attr> = ...`` in ``__init__``."""
        out = []
        for c in self.mro(cls):
            info = self.classes[c]
            out += list(info.fields)
            init = info.methods.get("__init__")
            for node in ast.walk(init) if init is not None else ():
                if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                        and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    out.append(node.attr)
        return list(dict.fromkeys(out))

    def first_class(self, candidates: list[str]) -> Optional[str]:
        """The first of ``candidates`` that is a class here (a protocol as its implementation)."""
        for q in candidates:
            if q in self.classes:
                return IMPLEMENTATIONS.get(q, q)
        return None

    def param_types(self, fn: FuncInfo) -> dict[str, str]:
        a = fn.node.args
        env: dict[str, str] = {}
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
        for i, p in enumerate(params):
            t = self.type_of_annotation(p.annotation, fn.module)
            if t is None and p.annotation is None:
                t = self.first_class(PARAM_TYPES.get(p.arg, []))
            if t:
                env[p.arg] = t
        if fn.cls and params and not _is_static(fn.node):
            env[params[0].arg] = fn.cls   # self (or cls: its methods are the class's)
        return env

    def expr_type(self, e: ast.expr, fn: FuncInfo, env: dict[str, str], seen: frozenset = frozenset()):
        """The slick class of an expression's value, when the walk can tell."""
        if isinstance(e, ast.Name):
            return env.get(e.id)
        if isinstance(e, ast.Await):
            return self.expr_type(e.value, fn, env, seen)
        if isinstance(e, ast.BoolOp):
            for v in e.values:
                t = self.expr_type(v, fn, env, seen)
                if t:
                    return t
            return None
        if isinstance(e, ast.IfExp):
            return self.expr_type(e.body, fn, env, seen) or self.expr_type(e.orelse, fn, env, seen)
        if isinstance(e, ast.Attribute):
            base = self.expr_type(e.value, fn, env, seen)
            if base:
                return self.attr_type(base, e.attr, seen)
            return None
        if isinstance(e, ast.Call):
            for callee, kind in self.resolve_call(e, fn, env):
                if kind == "ctor":
                    return _class_of(callee, self)
                info = self.funcs.get(callee)
                if info is not None:
                    t = self.type_of_annotation(info.node.returns, info.module)
                    if t:
                        return t
        return None

    def resolve_call(self, call: ast.Call, fn: FuncInfo, env: dict[str, str]) -> list[tuple[str, str]]:
        """The slick functions ``call`` runs, each with how it binds: "func" (plain), "bound" (a method on an
        instance: ``self`` is the receiver), "classmethod" (``cls`` bound) or "ctor" (a constructor)."""
        f = call.func
        text = ast.unparse(f)
        if (fn.qualname, text) in DYNAMIC:
            return [(q, "func") for q in DYNAMIC[(fn.qualname, text)]]
        if isinstance(f, ast.Name):
            if f.id in env:   # an instance called: its __call__
                m = self.method(env[f.id], "__call__")
                return [(m, "bound")] if m else []
            sym = self.symbol(fn.module, f.id)
            return self._bind_symbol(sym)
        if isinstance(f, ast.Attribute):
            sym = self.dotted_symbol(f, fn.module)
            if sym is not None:
                return self._bind_symbol(sym)
            owner = self.dotted_symbol(f.value, fn.module)
            if owner and owner[0] == "class":   # Cls.method(...)
                m = self.method(owner[1], f.attr)
                if m is None:
                    return []
                return [(m, "classmethod" if _is_classmethod(self.funcs[m].node) else
                         "func" if _is_static(self.funcs[m].node) else "unbound")]
            base = self.expr_type(f.value, fn, env)
            if base:
                m = self.method(base, f.attr)
                if m:
                    return [(m, "func" if _is_static(self.funcs[m].node) else "bound")]
            return []
        base = self.expr_type(f, fn, env)   # (a or b)(x), make()(x): the value's __call__
        if base:
            m = self.method(base, "__call__")
            return [(m, "bound")] if m else []
        return []

    def _bind_symbol(self, sym) -> list[tuple[str, str]]:
        if sym is None or sym[0] == "module":
            return []
        if sym[0] == "class":
            return [(self.constructor(sym[1]), "ctor")]
        return [(sym[1], "func")]


def _dotted(e: ast.expr) -> str:
    try:
        return ast.unparse(e)
    except Exception:   # noqa: BLE001
        return ""


def _decorators(node: ast.AST) -> set[str]:
    return {_dotted(d) for d in getattr(node, "decorator_list", [])}


def _is_static(node: ast.AST) -> bool:
    return "staticmethod" in _decorators(node)


def _is_classmethod(node: ast.AST) -> bool:
    return "classmethod" in _decorators(node)


def _class_of(callee: str, index: Index) -> Optional[str]:
    """The class a constructor target belongs to (``X.__init__`` -> ``X``; a leaf class is itself)."""
    if callee in index.classes:
        return callee
    info = index.funcs.get(callee)
    return info.cls if info else None


# ------------------------------------------------------------------------------------------------ the walk
@dataclass
class Edge:
    caller: str
    callee: str
    line: int              # in the caller's module
    depth: int
    carries: bool          # an argument or the receiver carries the sample
    first: bool            # the walk entered the callee here (else it had been entered before)


@dataclass
class Walk:
    edges: list[Edge] = field(default_factory=list)
    entered: list[str] = field(default_factory=list)
    unresolved: list[tuple[str, int, str]] = field(default_factory=list)   # (function, line, callee as written)


def _names(e: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}


def _body_nodes(node: ast.AST):
    """The function's own nodes in source order (nested functions and lambdas included: closures run its data)."""
    nodes = [n for n in ast.walk(node) if n is not node and hasattr(n, "lineno")]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _bind(fn_node: ast.AST, call: ast.Call, kind: str, carrying: list[bool], kw_carrying: dict[str, bool],
          receiver: bool) -> set[str]:
    """The callee's parameters that receive a carrying argument."""
    a = fn_node.args
    params = [p.arg for p in [*a.posonlyargs, *a.args]]
    out: set[str] = set()
    if kind in ("bound", "classmethod", "ctor") and params:
        if kind == "bound" and receiver:
            out.add(params[0])
        if kind == "ctor" and (any(carrying) or any(kw_carrying.values())):
            out.add(params[0])   # a constructed object holds what it was given
        params = params[1:]
    for i, c in enumerate(carrying):
        if c:
            if i < len(params):
                out.add(params[i])
            elif a.vararg is not None:
                out.add(a.vararg.arg)
    names = set(params) | {p.arg for p in a.kwonlyargs}
    for k, c in kw_carrying.items():
        if c:
            if k == "**":
                out |= names
            elif k in names:
                out.add(k)
            elif a.kwarg is not None:
                out.add(a.kwarg.arg)
    return out


class Walker:
    def __init__(self, index: Index, only_sample: bool):
        self.index = index
        self.only_sample = only_sample
        self.walk = Walk()
        self.visited: set[str] = set()

    def run(self, start: str, carrying: set[str]) -> Walk:
        self.visit(start, carrying, 0)
        return self.walk

    def _carries(self, e: ast.AST, carry: set[str], fn: FuncInfo, env: dict) -> bool:
        """``e`` mentions a carrying name outside a call to a loss function (a loss's result carries nothing)."""
        if isinstance(e, ast.Call) and any(q in TARGETS for q, _ in self.index.resolve_call(e, fn, env)):
            return False
        if isinstance(e, ast.Name):
            return e.id in carry
        return any(self._carries(c, carry, fn, env) for c in ast.iter_child_nodes(e))

    def visit(self, qualname: str, carrying: set[str], depth: int) -> None:
        self.visited.add(qualname)
        self.walk.entered.append(qualname)
        fn = self.index.funcs.get(qualname)
        if fn is None or qualname in TARGETS:
            return
        env = self.index.param_types(fn)
        carry = set(carrying)
        nodes = _body_nodes(fn.node)
        # locals: their classes (from constructors and annotated returns) and whether they carry the sample
        for _ in range(3):
            for n in nodes:
                targets, value = [], None
                if isinstance(n, ast.Assign):
                    targets, value = n.targets, n.value
                elif isinstance(n, (ast.AnnAssign, ast.AugAssign)) and n.value is not None:
                    targets, value = [n.target], n.value
                elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                    targets, value = [n.target], n.iter
                elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                    targets, value = [n.optional_vars], n.context_expr
                elif isinstance(n, ast.NamedExpr):
                    targets, value = [n.target], n.value
                if value is None:
                    continue
                if self._carries(value, carry, fn, env):
                    for t in targets:
                        carry |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}
                for t in targets:
                    if isinstance(t, ast.Name):
                        typ = self.index.expr_type(value, fn, env)
                        if typ and t.id not in env:
                            env[t.id] = typ
                    elif isinstance(t, ast.Tuple) and isinstance(value, (ast.Call, ast.Await)):
                        call = value.value if isinstance(value, ast.Await) else value
                        if not isinstance(call, ast.Call):
                            continue
                        for callee, kind in self.index.resolve_call(call, fn, env):
                            info = self.index.funcs.get(callee)
                            elts = info and self.index.tuple_annotation(info.node.returns, info.module)
                            if elts:
                                for x, typ in zip(t.elts, elts):
                                    if isinstance(x, ast.Name) and typ and x.id not in env:
                                        env[x.id] = typ
        for n in nodes:
            if not isinstance(n, ast.Call):
                continue
            resolved = self.index.resolve_call(n, fn, env)
            if not resolved:
                if self._interesting_unresolved(n, carry, fn, env):
                    self.walk.unresolved.append((qualname, n.lineno, ast.unparse(n.func)))
                continue
            receiver = isinstance(n.func, ast.Attribute) and self._carries(n.func.value, carry, fn, env)
            args = [self._carries(a, carry, fn, env) for a in n.args]
            kws = {(k.arg or "**"): self._carries(k.value, carry, fn, env) for k in n.keywords}
            carries = receiver or any(args) or any(kws.values())
            if self.only_sample and not carries:
                continue
            for callee, kind in resolved:
                first = callee not in self.visited
                self.walk.edges.append(Edge(qualname, callee, n.lineno, depth, carries, first))
                if first:
                    info = self.index.funcs.get(callee)
                    bound = _bind(info.node, n, kind, args, kws, receiver) if info else set()
                    self.visit(callee, bound, depth + 1)

    def _interesting_unresolved(self, call: ast.Call, carry: set[str], fn: FuncInfo, env: dict) -> bool:
        """A call the walk could not resolve that may run slick code: a method on ``self.<part>`` or on a
        carrying value, or a call of a carrying name (not builtins, not methods of str/list/dict/torch...)."""
        f = call.func
        if isinstance(f, ast.Name):
            return f.id in carry
        if not isinstance(f, ast.Attribute):
            return False
        v = f.value
        if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
            cls = self.index.classes.get(fn.cls) if fn.cls else None
            ann = cls.fields.get(v.attr) if cls else None   # declared with a type that is not slick's (a Tensor)
            return ann is None or self.index.type_of_annotation(ann, cls.module) is not None
        return False


# ---------------------------------------------------------------------------------------------- numbers
def _room_order(root: Path = ROOT) -> tuple[dict[str, int], list[str]]:
    order = import_graph.layers(root)
    rank = {room: i for i, layer in enumerate(order) for room in layer}   # 0 = top
    return rank, sorted(rank, key=len, reverse=True)


def _module_of(qualname: str, index: Index) -> str:
    if qualname in index.funcs:
        return index.funcs[qualname].module
    if qualname in index.classes:
        return index.classes[qualname].module
    return qualname.rpartition(".")[0]


@dataclass
class Counts:
    moves: int
    up: int
    sideways: int
    step_entries: int
    calls: int
    into_dataclasses: int = 0                                  # moves into a dataclass's method or constructor
    room_pairs: dict = field(default_factory=dict)             # (room A, room B) -> moves


def count(edges: list[Edge], index: Index, root: Path = ROOT) -> tuple[Counts, list[tuple[Edge, str, str, str]]]:
    """The three numbers over distinct caller -> callee pairs, and each pair with its rooms and direction."""
    rank, rooms = _room_order(root)
    seen, rows = set(), []
    c = Counts(0, 0, 0, 0, 0)
    for e in edges:
        if (e.caller, e.callee) in seen:
            continue
        seen.add((e.caller, e.callee))
        c.calls += 1
        ma, mb = _module_of(e.caller, index), _module_of(e.callee, index)
        a, b = import_graph.room_of(ma, rooms), import_graph.room_of(mb, rooms)
        way = ""
        if a and b and a != b:
            c.moves += 1
            c.room_pairs[(a, b)] = c.room_pairs.get((a, b), 0) + 1
            owner = _class_of(e.callee, index) if e.callee not in index.funcs or index.funcs[e.callee].cls else None
            if owner and any("dataclass" in _dotted(d) for d in index.classes[owner].node.decorator_list):
                c.into_dataclasses += 1
            if rank[b] < rank[a]:
                c.up += 1
                way = "UP"
            elif rank[b] == rank[a]:
                c.sideways += 1
                way = "sideways"
            else:
                way = "down"
        if mb == STEP_MODULE and ma != STEP_MODULE:
            c.step_entries += 1
            way = (way + " " if way else "") + "enters step.py"
        rows.append((e, a or ma, b or mb, way))
    return c, rows


def _short(room: str) -> str:
    return room.removeprefix(PACKAGE + ".")


def dataclass_fields(modules=PARTS_MODULES, root: Path = ROOT) -> dict[str, int]:
    """Fields of each dataclass in ``modules`` (those that exist), by ``module.Class``: annotated class-level
    names, ClassVar left out."""
    out = {}
    for module in modules:
        path = root / (module.replace(".", "/") + ".py")
        if not path.is_file():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any("dataclass" in _dotted(d) for d in node.decorator_list):
                out[f"{module}.{node.name}"] = sum(1 for x in node.body if isinstance(x, ast.AnnAssign)
                                                   and "ClassVar" not in _dotted(x.annotation))
    return out


def config_reads(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """tests/test_config_typed.py's walker over ``root``/slick (slick/config and slick/configure left out):
    (file, line, what) for each unannotated ``cfg`` parameter and each ``getattr(<config>, "name", default)``."""
    out = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if not rel.startswith(test_config_typed.EXCLUDED):
            out += [(rel, n, what) for n, what in test_config_typed.offenders(path.read_text())]
    return out


def measure(root: Path = ROOT) -> dict:
    index = Index(root)
    if START not in index.funcs:
        raise SystemExit(f"{START} not found")
    path = Walker(index, only_sample=True).run(START, {"groups"})
    whole = Walker(index, only_sample=False).run(START, {"groups"})
    pc, prows = count(path.edges, index, root)
    wc, _ = count(whole.edges, index, root)
    step_file = root / (STEP_MODULE.replace(".", "/") + ".py")
    cfg_found = config_reads(root)
    return {
        "index": index, "path": path, "whole": whole, "path_counts": pc, "whole_counts": wc, "rows": prows,
        "step_lines": len(step_file.read_text().splitlines()),
        "dataclass_fields": dataclass_fields(PARTS_MODULES, root),
        "cfg_unannotated": sum(1 for _, _, what in cfg_found if what.startswith("parameter 'cfg'")),
        "cfg_getattr_defaults": sum(1 for _, _, what in cfg_found if what.startswith("getattr(")),
        "cfg_offenders": cfg_found,
    }


def report(root: Path = ROOT) -> dict:
    m = measure(root)
    index = m["index"]
    print(f"The sample's path from {START} to the loss (depth first; '=' a function entered before):")
    for e, a, b, way in m["rows"]:
        callee = e.callee.removeprefix(PACKAGE + ".")
        mark = "" if e.first else "= "
        rooms = f"{_short(a)} -> {_short(b)}" if a != b else _short(a)
        line = f"{'  ' * e.depth}{e.caller.removeprefix(PACKAGE + '.')}:{e.line} -> {mark}{callee}"
        print(f"{line:<110} [{rooms}]{'  ' + way if way else ''}")
    pc, wc = m["path_counts"], m["whole_counts"]
    print()
    print(f"moves between rooms: {pc.moves} (target <= {MAX_MOVES})")
    print(f"moves back up: {pc.up} (target <= {MAX_UP}); sideways (same layer): {pc.sideways}")
    print(f"entries into slick/loop/step.py: {pc.step_entries}")
    pairs = ", ".join(f"{_short(a)}->{_short(b)} {n}" for (a, b), n in sorted(pc.room_pairs.items()))
    print(f"  of the moves, {pc.into_dataclasses} call a method or the constructor of a dataclass (TrainBatch, "
          f"Advantages, LossInputs...); by rooms: {pairs}")
    print(f"  ({pc.calls} distinct calls on the path, {len(set(m['path'].entered))} functions entered)")
    print(f"whole walk from {START} (every resolved call, {len(set(m['whole'].entered))} functions): "
          f"moves {wc.moves}, back up {wc.up}, sideways {wc.sideways}, step.py entries {wc.step_entries}")
    unresolved = sorted(set(m["path"].unresolved))
    methods: dict[str, list[str]] = {}
    for c in index.classes.values():
        for name in c.methods:
            methods.setdefault(name, []).append(c.qualname.removeprefix(PACKAGE + "."))
    maybe = [(q, line, what) for q, line, what in unresolved if what.rpartition(".")[2] in methods]
    print(f"calls on the path the walk could not resolve: {len(unresolved)} (self.<attr>.m(...) of an untyped "
          f"attribute, or a carrying callable); {len(maybe)} name a method some slick class defines:")
    for q, line, what in maybe:
        where = methods[what.rpartition(".")[2]]
        print(f"  {q.removeprefix(PACKAGE + '.')}:{line}: {what}(...)  (defined by {', '.join(where[:3])}"
              f"{'...' if len(where) > 3 else ''})")
    print()
    print(f"lines of slick/loop/step.py: {m['step_lines']}")
    for name, n in m["dataclass_fields"].items():
        print(f"fields of {name}: {n}")
    print(f"unannotated cfg parameters outside slick/config, slick/configure: {m['cfg_unannotated']}")
    print(f"getattr(<config>, name, default) outside slick/config, slick/configure: {m['cfg_getattr_defaults']}")
    for f, n, what in m["cfg_offenders"]:
        print(f"  {f}:{n}: {what}")
    return m


if __name__ == "__main__":
    report(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)

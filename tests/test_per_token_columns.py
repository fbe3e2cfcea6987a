"""No loose per-token columns outside ``slick/loop/`` and ``slick/algo/``.

The per-token columns of a rollout step (``advantages``, ``old_logprobs``, ``ref_logprobs``, ``returns``,
``values``) travel in one ``slick.algo.batch.TrainBatch``: the loop fills it, the trainer receives it
(``train_step(batch, objective)``) and builds the loss's typed inputs from it (``LossInputs``, in
``slick/train/trainer.py`` ``_loss_inputs``). Outside slick/loop and slick/algo, an AST walk over slick/**/*.py finds

(a) a function (or lambda) with a parameter named like one of the five columns: a per-sample column list passed
    loose instead of the batch;
(b) a call passing a keyword argument named like one of them, except to the typed containers: the
    ``LossInputs(...)`` / ``AdvantageInputs(...)`` constructors (the loss's and estimator's inputs), ``TrainBatch(...)``
    and ``TrainBatch``'s own methods (``with_columns``, ``from_samples``...: read from slick/algo/batch.py).

Only these five names count: ``logprobs`` (the engine's sampling logprobs, a trainer's output) is another thing.
A name that means something else where it stands (a config's flat ``values``...) is in :data:`ALLOWED` with its
reason; every offender is reported as file:line. Reading a column off a batch (``batch.advantages``) is how the
trainer is meant to get it and is not checked.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLICK = ROOT / "slick"
ROOMS = ("slick/loop/", "slick/algo/")        # where the columns are built and consumed loose
COLUMNS = ("advantages", "old_logprobs", "ref_logprobs", "returns", "values")
TYPED_INPUTS = {"LossInputs", "AdvantageInputs", "TrainBatch"}   # constructors that take the columns by name

# (file, function, parameter) -> why the name is not a per-token column there. A real offender waiting for its
# fix would go here as "# pending: <reason>"; there is none.
ALLOWED = {
    ("slick/config/config.py", "from_flat", "values"): "a config's flat {field: value} dict",
    ("slick/config/sft_distill.py", "sft_defaults", "values"): "flat config values the SFT defaults fill in",
    ("slick/observe/inspect/data.py", "_hist", "values"): "the floats a histogram of `slick inspect` counts",
    ("slick/proc/dist.py", "all_reduce_values", "values"): "a list of float metrics reduced over the ranks",
}


def batch_methods(root: Path = ROOT) -> set[str]:
    """The methods ``TrainBatch`` defines (slick/algo/batch.py)."""
    tree = ast.parse((root / "slick/algo/batch.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainBatch":
            return {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    raise AssertionError("slick/algo/batch.py defines no TrainBatch")


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def offenders(source: str, methods: set[str] | frozenset = frozenset()) -> list[tuple[int, str, str, str]]:
    """(line, function, name, what) for every parameter named like a column and every keyword argument named
    like one outside a call to the typed inputs or to a method in ``methods`` (TrainBatch's)."""
    found = []

    def visit(node: ast.AST, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = func
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                name = getattr(child, "name", "<lambda>")
                a = child.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                    if arg is not None and arg.arg in COLUMNS:
                        found.append((arg.lineno, name, arg.arg,
                                      f"parameter {arg.arg!r} of {name}(): take the TrainBatch, not a loose column"))
            elif isinstance(child, ast.Call):
                callee = _callee(child)
                is_method = isinstance(child.func, ast.Attribute)
                if not (callee in TYPED_INPUTS or (is_method and callee in methods)):
                    for kw in child.keywords:
                        if kw.arg in COLUMNS:
                            found.append((kw.value.lineno, func, kw.arg,
                                          f"{ast.unparse(child.func)}(..., {kw.arg}=...) in {func}(): a loose "
                                          f"column passed outside TrainBatch / LossInputs / AdvantageInputs"))
            visit(child, name)

    visit(ast.parse(source), "<module>")
    return sorted(found)


def scan(root: Path = ROOT) -> tuple[list[str], set]:
    """Offenders under ``root``/slick outside slick/loop and slick/algo as "file:line: what" (allowed ones left
    out), and the ALLOWED keys that matched something."""
    methods = batch_methods(root)
    out, used = [], set()
    for path in sorted((root / "slick").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(ROOMS):
            continue
        for line, func, name, what in offenders(path.read_text(), methods):
            if (rel, func, name) in ALLOWED:
                used.add((rel, func, name))
            else:
                out.append(f"{rel}:{line}: {what}")
    return out, used


def test_no_loose_per_token_columns_outside_loop_and_algo():
    found, _ = scan()
    assert not found, "loose per-token columns outside slick/loop and slick/algo (pass the TrainBatch):\n" + \
        "\n".join(found)


def test_every_allowed_entry_still_exists():
    """An exception whose code went away leaves the allowlist."""
    _, used = scan()
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match nothing any more (remove them): {stale}"


def test_the_walker_flags_injected_offenders():
    source = '''
from slick.algo.inputs import LossInputs, AdvantageInputs

def train_step(self, samples, advantages, old_logprobs=None, *, ref_logprobs=None):
    return self.forward(samples, advantages=advantages, values=None)

def ok(self, batch, logprobs, objective):
    inputs = LossInputs(logprobs, None, mask, batch.advantages, old_logprobs=batch.old_logprobs)
    est = AdvantageInputs(rewards=r, mask=m, group_size=2, values=v, ref_logprobs=None)
    return batch.with_columns(returns=r), objective(inputs), est

def loose(trainer, batch):
    return trainer.train_step(batch.samples, returns=batch.returns), (lambda values: values)
'''
    got = [(line, func, name) for line, func, name, _ in offenders(source, {"with_columns"})]
    assert got == [
        (4, "train_step", "advantages"), (4, "train_step", "old_logprobs"), (4, "train_step", "ref_logprobs"),
        (5, "train_step", "advantages"), (5, "train_step", "values"),
        (13, "<lambda>", "values"), (13, "loose", "returns"),
    ]
    # ``with_columns`` is a TrainBatch method only when called as one: a plain function of that name is not
    assert [n for _, _, n, _ in offenders("with_columns(returns=r)\n", {"with_columns"})] == ["returns"]


def test_the_scan_reports_file_and_line(tmp_path):
    """A copy of the package with one loose column injected outside the rooms fails, naming file:line."""
    (tmp_path / "slick/algo").mkdir(parents=True)
    (tmp_path / "slick/algo/batch.py").write_text((ROOT / "slick/algo/batch.py").read_text())
    (tmp_path / "slick/train").mkdir()
    (tmp_path / "slick/train/bad.py").write_text("def step(batch):\n    return run(advantages=batch.advantages)\n")
    (tmp_path / "slick/loop").mkdir()
    (tmp_path / "slick/loop/fine.py").write_text("def f(advantages):\n    return advantages\n")
    found, _ = scan(tmp_path)
    assert len(found) == 1 and found[0].startswith("slick/train/bad.py:2: run(..., advantages=...) in step()")

"""Config by group: a ``ConfigView`` gives a component the groups it declares and nothing else, loudly.

Statically: every function that narrows its config (``cfg = cfg.view(...)``) and every class with
``CONFIG_GROUPS`` reads only fields of the groups it names. At run time a read outside raises
``ConfigScopeError`` (not an AttributeError, so ``getattr(view, name, default)`` cannot hide it)."""
import ast
import pickle
from pathlib import Path

import pytest

from slick.config import Config, ConfigScopeError, ConfigView
from slick.config.config import _FIELD_GROUP
from slick.config.groups import GROUPS

ROOT = Path(__file__).resolve().parents[1] / "slick"


def test_a_view_reads_its_groups_flat_and_by_name():
    cfg = Config.from_flat({"lr": 3e-4, "rollout_temperature": 0.7, "rm_type": "math"})
    v = cfg.view("train", "rollout")
    assert (v.lr, v.rollout_temperature, v.train.lr) == (3e-4, 0.7, 3e-4)
    assert v.groups == ("train", "rollout") and v.train is cfg.train      # the config's own group objects
    cfg.lr = 1e-5
    assert v.lr == 1e-5                                                     # one source of truth


def test_a_field_of_another_group_is_refused_by_name_and_getattr_cannot_hide_it():
    v = Config().view("train")
    with pytest.raises(ConfigScopeError) as e:
        v.rm_type
    assert str(e.value) == ("'rm_type' is in config group 'reward', which this component was not given "
                            "(its groups: train)")
    with pytest.raises(ConfigScopeError, match="'reward'"):
        getattr(v, "rm_type", None)
    with pytest.raises(ConfigScopeError, match="config group 'reward'"):
        v.reward
    with pytest.raises(AttributeError, match="Config has no field 'no_such_flag'"):
        v.no_such_flag
    assert getattr(v, "no_such_flag", 7) == 7


def test_a_view_is_read_only_narrows_and_pickles():
    cfg = Config.from_flat({"lr": 2e-5, "max_staleness": 3})
    v = cfg.view("train", "rollout")
    with pytest.raises(AttributeError, match="read-only"):
        v.lr = 1.0
    narrow = v.view("rollout")
    assert narrow.max_staleness == 3 and narrow.groups == ("rollout",)
    with pytest.raises(ConfigScopeError, match="config group.s. reward asked of a view of train, rollout"):
        v.view("reward")
    with pytest.raises(ValueError, match="no config group 'nope'"):
        cfg.view("nope")
    back = pickle.loads(pickle.dumps(v))                   # Ray ranks receive views
    assert isinstance(back, ConfigView) and back.to_dict() == v.to_dict() and back.groups == v.groups


def _reads(node: ast.AST, names: tuple) -> set:
    """Config fields read as ``<name>.field`` or ``self.cfg.field`` under ``node``."""
    out = set()
    for n in ast.walk(node):
        if not isinstance(n, ast.Attribute) or n.attr not in _FIELD_GROUP:
            continue
        v = n.value
        if (isinstance(v, ast.Name) and v.id in names) or (
                isinstance(v, ast.Attribute) and v.attr == "cfg" and isinstance(v.value, ast.Name) and v.value.id == "self"):
            out.add(n.attr)
    return out


def _top_level_functions() -> dict:
    """{name: [FunctionDef, ...]} of slick's module-level functions (a name defined twice: both)."""
    defs: dict = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, []).append(node)
    return defs


def _reads_deep(fn, names: tuple, defs: dict, seen: set) -> set:
    """The fields ``fn`` reads through ``names``, and those read by the module-level functions it hands the same
    config to (``f(cfg, ...)``: the callee's parameter in that position), transitively."""
    out = _reads(fn, names)
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in defs):
            continue
        for pos, arg in enumerate(call.args):
            if not (isinstance(arg, ast.Name) and arg.id in names):
                continue
            for callee in defs[call.func.id]:
                params = [a.arg for a in callee.args.posonlyargs + callee.args.args]
                if pos < len(params) and (callee, params[pos]) not in seen:
                    seen.add((callee, params[pos]))
                    out |= _reads_deep(callee, (params[pos],), defs, seen)
    return out


def _narrowed() -> list:
    """(where, declared groups, fields read) for every narrowing function and every class with CONFIG_GROUPS."""
    from slick.cluster.trainer_group import RANK_GROUPS
    from slick.train.heads import PolicyHead, ValueHead
    from slick.train.trainer import Trainer

    star = {"Trainer": Trainer.CONFIG_GROUPS, "PolicyHead": PolicyHead.CONFIG_GROUPS,
            "ValueHead": ValueHead.CONFIG_GROUPS, "RANK_GROUPS": RANK_GROUPS}
    defs = _top_level_functions()
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "config" in path.parts[-2:-1]:
            continue
        tree = ast.parse(path.read_text())
        for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            decl = [s for s in cls.body if isinstance(s, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "CONFIG_GROUPS" for t in s.targets)]
            if decl:
                found.append((f"{path.name}:{cls.name}", star[cls.name], _reads_deep(cls, ("cfg", "c"), defs, set())))
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for st in fn.body:
                if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and getattr(st.value.func, "attr",
                                                                                              "") == "view":
                    args = st.value.args
                    if args and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                        groups = tuple(a.value for a in args)
                    elif len(args) == 1 and isinstance(args[0], ast.Starred) and isinstance(args[0].value, ast.Name):
                        groups = star[args[0].value.id]                 # cfg.view(*RANK_GROUPS)
                    else:
                        continue   # cfg.view(*self.CONFIG_GROUPS) (checked with its class), or a tensor's view
                    found.append((f"{path.name}:{fn.name}", groups, _reads_deep(fn, ("cfg",), defs, set())))
    return found


def test_narrowed_components_read_only_their_declared_groups():
    found = _narrowed()
    names = {w for w, _, _ in found}
    # the components given groups: the trainer, the critic, the Ray ranks, the optimizer's schedule, the engine
    # and teacher factories, the weight sink, the thread split, the Ray cluster, tools, chats, the async producer
    for want in ("trainer.py:Trainer", "heads.py:PolicyHead", "heads.py:ValueHead", "trainer_group.py:__init__", "lr.py:lr_factor_from_config",
                 "engines.py:make_engines", "teacher.py:make_teacher", "weights.py:__init__",
                 "threads.py:thread_split", "__init__.py:start_cluster", "tools.py:from_config",
                 "chats.py:from_config", "producer.py:__init__"):
        assert want in names, want
    wrong = [(w, f, _FIELD_GROUP[f]) for w, groups, fields in found for f in sorted(fields)
             if _FIELD_GROUP[f] not in groups]
    assert wrong == []
    assert all(set(groups) <= set(GROUPS) for _, groups, _ in found)


def test_the_trainer_keeps_only_its_groups(tiny_model_dir):
    from slick.train.trainer import Trainer

    cfg = Config.from_flat({"hf_checkpoint": str(tiny_model_dir), "rm_type": "math"})
    tr = Trainer(cfg)
    assert isinstance(tr.cfg, ConfigView) and tr.cfg.groups == Trainer.CONFIG_GROUPS
    with pytest.raises(ConfigScopeError, match="'rm_type' is in config group 'reward'"):
        tr.cfg.rm_type

"""slick.loop.build: a run's parts get what they need at construction, and nothing in slick/loop or slick/observe
changes a part after it is built."""
import ast
import asyncio
import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest

from slick.config import Config
from slick.configure.validate import async_lead, validate_config
from slick.engine.local import LocalEngine
from slick.loop.build import MODES, build, staleness_bound
from slick.loop.parts import Parts, Processes, RolloutParts, RunOutputs, TrainParts
from slick.loop.run import Run
from slick.loop.threads import ThreadPolicy, thread_split
from slick.rollout.interrupt import InterruptibleEngine

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {f.name: f.type for f in dataclasses.fields(Parts)}   # rollout_parts, train_parts, outputs, ...
PARTS = {f.name for group in (RolloutParts, TrainParts, RunOutputs, Processes) for f in dataclasses.fields(group)}
RUN_NAMES = {"run", "parts", "c", "components"}


def patches(source: str, name: str = "<src>") -> list:
    """Assignments to an attribute of a run part (``run.X.Y = ...``, ``self.run.X.Y = ...``, ``c.X.Y = ...``,
    ``self.X.Y = ...`` for a part name X, and the same through a group: ``run.train_parts.X.Y = ...``,
    ``train_parts.X.Y = ...``) and ``setattr`` on one."""
    def is_run(node) -> bool:    # run / c / self / self.run, or a group of one (run.train_parts, train_parts)
        if isinstance(node, ast.Name):
            return node.id in RUN_NAMES or node.id in GROUPS or node.id == "self"
        if isinstance(node, ast.Attribute) and node.attr in GROUPS:
            return is_run(node.value)
        return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr in RUN_NAMES)

    def is_part(node) -> bool:   # run.X / self.run.X / c.X / self.X / run.<group>.X with X a part
        return isinstance(node, ast.Attribute) and node.attr in PARTS and is_run(node.value)

    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and node.args and is_part(node.args[0])):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and is_part(sub.value):
                    found.append(f"{name}:{node.lineno}: {ast.unparse(t)} = ...")
    return found


def test_the_check_finds_every_patch_the_loop_used_to_make():
    old = textwrap.dedent('''
        run.buffer.max_staleness = lead * k
        run.manager.engine = engine
        run.trainer.thread_budget = lambda: run.train_threads if engine.busy() else run.cores
        run.rewards.on_scored = exporter.observe_reward
        self.run.manager.on_generated = exporter.observe_generated
        self.trainer.thread_budget += 1
        run.rollout_parts.buffer.max_staleness = 3
        self.train_parts.trainer.thread_budget = None
        train_parts.trainer.thread_budget = None
        setattr(run.trainer, "thread_budget", None)
        run.engine_version = 3            # the run's own attribute: not a part's
        c.trainer = make_trainer(cfg)     # the builder filling its container: not a part's attribute
        processes.trainer = trainer       # likewise
        budget.value = 2
    ''')
    assert [line.split(": ", 1)[1] for line in patches(old)] == [
        "run.buffer.max_staleness = ...", "run.manager.engine = ...", "run.trainer.thread_budget = ...",
        "run.rewards.on_scored = ...", "self.run.manager.on_generated = ...", "self.trainer.thread_budget = ...",
        "run.rollout_parts.buffer.max_staleness = ...", "self.train_parts.trainer.thread_budget = ...",
        "train_parts.trainer.thread_budget = ...", "setattr(run.trainer, 'thread_budget', None)"]


def test_nothing_in_loop_or_observe_patches_a_part_after_it_is_built():
    files = sorted((ROOT / "slick" / "loop").glob("*.py")) + sorted((ROOT / "slick" / "observe").rglob("*.py"))
    assert len(files) >= 15
    assert [f for p in files for f in patches(p.read_text(), str(p.relative_to(ROOT)))] == []


def test_thread_split_and_policy():
    cfg = Config.from_flat({})
    assert thread_split(cfg, overlap=False, device_is_cpu=True, cores=4) == (4, 4)
    assert thread_split(cfg, overlap=True, device_is_cpu=True, cores=5) == (3, 2)
    assert thread_split(cfg, overlap=True, device_is_cpu=False, cores=4) == (4, 4)
    assert thread_split(Config.from_flat({"train_num_threads": 1}), True, True, cores=4) == (1, 3)
    shared = ThreadPolicy(cores=4, train=2, rollout=2, take_turns=False, share_cores=True)
    assert (shared.train_budget(engine_busy=True), shared.train_budget(engine_busy=False)) == (2, 4)
    fixed = dataclasses.replace(shared, share_cores=False)
    assert fixed.train_budget(True) is None and fixed.train_budget(False) is None
    # a thread's OpenMP workers end with its phase when one team takes every core: in turn or shared, not split
    assert shared.releases_workers and dataclasses.replace(fixed, take_turns=True).releases_workers
    assert not fixed.releases_workers


@pytest.fixture()
def run_cfg(tmp_path):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(8)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "build_rm.py").write_text("def rm(args, sample):\n    return 1.0\n")
    sys.path.insert(0, str(tmp_path))

    def make(model_dir, driver="sync", **over):
        values = dict(hf_checkpoint=str(model_dir), prompt_data=str(tmp_path / "prompts.jsonl"),
                      rollout_batch_size=2, n_samples_per_prompt=2, rollout_max_response_len=4,
                      custom_rm_path="build_rm.rm", lr=1e-3, num_rollout=1, dtype="fp32",
                      run_dir=str(tmp_path / f"run-{driver}"), no_progress=True, seed=3, micro_batch_size=4)
        values.update(over)
        return validate_config(Config.from_flat(values), driver=driver)

    yield make
    sys.path.remove(str(tmp_path))


def _closed(run):
    asyncio.run(run.close())


def test_sync_parts_are_built_as_slick_train_needs_them(tiny_model_dir, run_cfg):
    cfg = run_cfg(tiny_model_dir)
    run = Run(cfg)
    try:
        ro, tr, out = run.rollout_parts, run.train_parts, run.outputs
        assert run.mode == "sync"
        assert ro.buffer.max_staleness == cfg.max_staleness == staleness_bound(cfg, "sync")
        # the manager holds a timed view of the engine (rollout/timeline.py)
        assert isinstance(ro.engine, LocalEngine) and ro.manager.engine.engine is ro.engine is ro.engines.engine
        assert tr.trainer.thread_budget is None and tr.threads.take_turns and not tr.threads.share_cores
        assert out.events is None and out.exporter is None
        assert ro.rewards.on_scored is None and ro.manager.on_generated is None
        assert tr.weights.transport == "colocated" and tr.weights.engines is ro.engines
        # the processes close stops are the parts' own
        assert (run.processes.trainer, run.processes.engines, run.processes.cluster) == (tr.trainer, ro.engines, None)
        assert (run.steps.start, run.steps.stop) == (0, 1)
    finally:
        _closed(run)


def test_async_parts_get_the_bound_the_engine_wrapper_the_budget_and_the_hooks(tiny_model_dir, run_cfg):
    cfg = run_cfg(tiny_model_dir, driver="async", max_staleness=3, num_steps_per_rollout=2, prometheus_port=0,
                  use_tis=True)
    run = Run(cfg, overlap=True)
    try:
        ro, tr, out = run.rollout_parts, run.train_parts, run.outputs
        assert run.mode == "async"
        assert ro.buffer.max_staleness == async_lead(cfg) * 2 == 2 == staleness_bound(cfg, "async")
        assert isinstance(ro.engine, InterruptibleEngine) and ro.manager.engine.engine is ro.engine
        assert ro.engine.engine is ro.engines.engine and ro.engine.mode == cfg.async_weight_update
        # the trainer asks the policy before each micro-batch: its share while a request is in flight
        assert tr.threads.share_cores and not tr.threads.take_turns
        assert tr.trainer.thread_budget() == tr.threads.cores
        ro.engine._inflight["r"] = "train"
        assert tr.trainer.thread_budget() == tr.threads.train
        ro.engine._inflight.clear()
        # the Prometheus hooks were given to the hub and the manager when they were built
        assert ro.rewards.on_scored == out.events.observe_reward
        assert ro.manager.on_generated == out.events.observe_generated
        assert out.exporter.events is out.events and out.exporter.registry is out.events.registry
        assert run.processes.exporter is out.exporter
    finally:
        _closed(run)


def test_groups_are_small_typed_and_frozen():
    """No grab-bag: each group holds what one phase reads, every field typed with a class (not Any), and a built
    group cannot be changed; Run has no attribute forwarding."""
    groups = (RolloutParts, TrainParts, RunOutputs, Processes, Parts)
    assert all(len(dataclasses.fields(g)) <= 8 for g in groups)
    assert all(f.type != "Any" for g in groups for f in dataclasses.fields(g))
    for g in (RolloutParts, TrainParts, RunOutputs, Parts):
        assert g.__dataclass_params__.frozen, g
    assert "__getattr__" not in vars(Run)
    import slick.loop
    loop_sources = (Path(slick.loop.__file__).parent).glob("*.py")
    assert not [p.name for p in loop_sources if "def __getattr__" in p.read_text()]


def test_build_refuses_an_unknown_mode_by_name(tiny_model_dir, run_cfg):
    assert MODES == ("sync", "async")
    with pytest.raises(ValueError, match="build: mode must be one of sync, async \\(got 'overlap'\\)"):
        build(run_cfg(tiny_model_dir), "overlap")

"""Validation reads the config it checks and never writes to it: derived values live in a frozen Plan and in the
new Config that validate_config returns; slick.algo reads typed AlgoParams, never an attribute bag with defaults."""
import ast
import copy
import dataclasses
import functools
from pathlib import Path

import pytest
import torch

from slick.algo import AdvantageInputs, AlgoParams, LossInputs, compute_policy_objective, grpo, rloo
from slick.config import Config, ConfigError
from slick.config.groups import AlgorithmConfig
from slick.configure.plan import Plan
from slick.configure.validate import validate, validate_config
from slick.algo.assemble import objective_from_config

ALGO = Path(__file__).resolve().parents[1] / "slick" / "algo"

# the lean settings a plan resolves when memory cannot be sized (no model here): fp32 moments, MLP activations kept
FP32 = {"exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32", "recompute_mlp": False}
# ... and the sequences slick's own engine decodes at once (64 when memory cannot be sized; none for servers at a URL)
FP32_64 = {**FP32, "engine_max_running": 64}

# (flags, driver, the plan expected)
CASES = [
    ({}, "sync", Plan(8 * 8, 1, "colocated", 0, False, offload_rollout=True, **FP32_64)),
    ({"rollout_batch_size": 2, "n_samples_per_prompt": 4, "global_batch_size": 4}, "sync",
     Plan(4, 2, "colocated", 0, False, offload_rollout=True, **FP32_64)),
    ({"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2, "update_weights_interval": 3},
     "sync", Plan(4, 2, "colocated", 4, False, offload_rollout=True, **FP32_64)),
    ({"rollout_batch_size": 2, "n_samples_per_prompt": 4, "num_steps_per_rollout": 2, "update_weights_interval": 3,
      "max_staleness": 7}, "sync", Plan(4, 2, "colocated", 7, False, offload_rollout=True, **FP32_64)),
    ({"rollout_engine": "http", "rollout_urls": ["http://127.0.0.1:1"]}, "sync",
     Plan(64, 1, "disk", 0, False, offload_rollout=False, **FP32)),
    ({"weight_transport": "disk"}, "sync", Plan(64, 1, "disk", 0, False, offload_rollout=True, **FP32_64)),
    ({"recompute_activations": True}, "sync", Plan(64, 1, "colocated", 0, True, offload_rollout=True, **FP32_64)),       # Megatron's recompute
    ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
      "sequence_parallel": True}, "sync", Plan(64, 1, "colocated", 0, True, offload_rollout=True, **FP32_64)),
    ({"rollout_batch_size": 2, "n_samples_per_prompt": 4, "max_staleness": 1, "use_tis": True,
      "update_weights_interval": 1}, "async", Plan(8, 1, "colocated", 1, False, offload_rollout=False, **FP32_64)),
]


@pytest.mark.parametrize("flags, driver, plan", CASES)
def test_validation_leaves_the_config_as_given_and_returns_the_plan(flags, driver, plan):
    cfg = Config.from_flat(copy.deepcopy(flags))
    before = copy.deepcopy(cfg)
    resolved, got = validate(cfg, check_files=False, driver=driver)
    assert got == plan
    assert cfg.to_dict() == before.to_dict()            # nothing written to the config that was checked
    assert resolved is not cfg
    flags = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.compare}   # not `auto`
    for name, value in flags.items():  # the returned Config carries the derived values
        assert getattr(resolved, name) == value
    # apart from the plan's fields, the returned Config is the given one
    assert {k: v for k, v in resolved.flat().items() if k not in flags} == \
        {k: v for k, v in before.flat().items() if k not in flags}
    assert validate_config(cfg, check_files=False, driver=driver).to_dict() == resolved.to_dict()
    assert cfg.to_dict() == before.to_dict()


def test_a_refused_config_is_left_as_given_too():
    cfg = Config.from_flat({"rollout_batch_size": 2, "n_samples_per_prompt": 4, "global_batch_size": 3,
                            "recompute_activations": True, "update_weights_interval": 2,
                            "tensor_model_parallel_size": 2})
    before = copy.deepcopy(cfg)
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, check_files=False)
    assert e.value.problems[0] == "--global-batch-size 3 does not divide rollout_batch_size x n_samples_per_prompt = 8"
    assert any(p.startswith("--tensor-model-parallel-size 2: not supported") for p in e.value.problems)
    assert cfg.to_dict() == before.to_dict()
    assert (cfg.global_batch_size, cfg.num_steps_per_rollout, cfg.gradient_checkpointing, cfg.weight_transport,
            cfg.max_staleness) == (3, None, None, "auto", 0)


def test_plan_is_frozen_and_apply_copies():
    cfg = Config.from_flat({"rollout_stop": ["</s>"]})
    plan = Plan(64, 1, "disk", 0, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.max_staleness = 3
    out = plan.apply(cfg)
    out.rollout_stop.append("x")                       # a deep copy: the user's lists are not shared
    assert cfg.rollout_stop == ["</s>"] and cfg.weight_transport == "auto" and out.weight_transport == "disk"
    assert plan.changes(cfg) == {"global_batch_size": 64, "num_steps_per_rollout": 1, "weight_transport": "disk",
                                 "gradient_checkpointing": False}   # unset (None): the plan says off


# --- slick.algo reads typed AlgoParams -------------------------------------------------------------------------

def _algo_calls():
    for path in sorted(ALGO.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            yield path.name, node


def test_algo_has_no_opt_and_no_getattr_on_cfg():
    bad = []
    for name, node in _algo_calls():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "opt":
            bad.append(f"{name}:{node.lineno} def opt")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "opt":
                bad.append(f"{name}:{node.lineno} opt(")
            if node.func.id in ("getattr", "hasattr") and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in ("cfg", "args"):
                bad.append(f"{name}:{node.lineno} {node.func.id}({node.args[0].id}")
            if node.func.id == "getattr" and len(node.args) == 3 and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id == "config":
                bad.append(f"{name}:{node.lineno} getattr(config, ..., default)")
    assert bad == []


def test_algo_params_hold_the_config_groups_values_and_no_default_of_their_own():
    fields = [f.name for f in dataclasses.fields(AlgoParams)]
    assert len(fields) == 35
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(AlgoParams))
    defaults = AlgorithmConfig()
    p = AlgoParams.from_config(Config())
    assert {n: getattr(p, n) for n in fields} == {n: getattr(defaults, n) for n in fields}
    assert p.kl_loss_type == "k1"                     # groups.py's default (opt() had copied "low_var_kl")
    assert AlgoParams.from_config(Config().algorithm) == p and AlgoParams.from_config(p) is p
    cfg = Config.from_flat({"gamma": 0.5, "eps_clip_high": 0.28})
    assert (AlgoParams.from_config(cfg).gamma, AlgoParams.from_config(cfg).eps_clip_high) == (0.5, 0.28)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.gamma = 0.9


def test_bags_are_refused_by_name():
    from types import SimpleNamespace
    with pytest.raises(ValueError, match=r"AlgoParams.from_config: SimpleNamespace lacks the algorithm field\(s\) "
                                         r"advantage_estimator, use_kl_loss, "):
        AlgoParams.from_config(SimpleNamespace(gamma=0.5))
    mask, logp = torch.ones(1, 2), torch.zeros(1, 2)
    with pytest.raises(TypeError, match="cfg must be a slick.algo.AlgoParams .*got Config"):
        compute_policy_objective(Config(), LossInputs(logp, None, mask, torch.ones(1, 2)))
    with pytest.raises(TypeError, match="AdvantageInputs.cfg must be a slick.algo.AlgoParams .*got SimpleNamespace"):
        AdvantageInputs(torch.ones(2), torch.ones(2, 2), 2, SimpleNamespace())
    with pytest.raises(ValueError, match="advantage estimator 'grpo' reads algorithm flags"):
        grpo(AdvantageInputs(torch.ones(2), torch.ones(2, 2), 2))
    out = rloo(AdvantageInputs(torch.tensor([3.0, 1.0]), torch.ones(2, 1), 2))   # reads no flag: None is fine
    assert out.advantages.flatten().tolist() == [2.0, -2.0]


def test_the_loop_binds_the_typed_params_to_the_loss():
    cfg = Config.from_flat({"eps_clip": 0.3, "use_kl_loss": True, "kl_loss_coef": 0.5})
    fn = objective_from_config(cfg)
    assert isinstance(fn, functools.partial) and fn.func is compute_policy_objective
    assert fn.args == (AlgoParams.from_config(cfg),)
    # k1 from groups.py: kl = logp - ref = 0.5 per token -> kl_loss 0.5, loss = 0 (on-policy pg, A = 0) + 0.25
    mask = torch.ones(1, 2)
    loss, m = fn(LossInputs(torch.zeros(1, 2), None, mask, torch.zeros(1, 2), ref_logprobs=torch.full((1, 2), -0.5)))
    assert m["kl_loss"] == 0.5 and float(loss) == 0.25

"""Cluster flags: each is honoured or refused with a message naming it; none is silently ignored.
A value counts as set when it differs from the field's default."""
import dataclasses

import pytest

from slick.config import ConfigError, parse_config
from slick.config.groups import ClusterConfig
from tests.hf_dirs import write_model_dir


@pytest.fixture
def base(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    return ["--hf-checkpoint", str(write_model_dir(tmp_path / "model")), "--prompt-data", str(data)]


def problems(argv):
    with pytest.raises(ConfigError) as e:
        parse_config(argv)
    return e.value.problems


@pytest.mark.parametrize("extra,message", [
    (["--actor-num-nodes", "2"], "--actor-num-nodes 2: not supported yet, only 1"),
    (["--actor-num-gpus-per-node", "8"], "--actor-num-gpus-per-node 8: not supported yet, only 0 or 1"),
    (["--rollout-num-gpus", "8"], "--rollout-num-gpus 8: not supported yet: launch SGLang servers yourself and pass "
                                  "--rollout-engine http --rollout-urls"),
    (["--rollout-num-gpus-per-engine", "2"], "--rollout-num-gpus-per-engine 2: not supported yet: launch SGLang "
                                             "servers yourself"),
    (["--use-fault-tolerance"], "--use-fault-tolerance: not supported yet"),
    (["--colocate", "--rollout-engine", "http", "--rollout-urls", "http://127.0.0.1:1"],
     "--colocate needs the in-process engine (--rollout-engine local)"),
])
def test_each_unsupported_cluster_flag_is_refused_by_name(base, extra, message):
    (p,) = problems(base + extra)
    assert p.startswith(message), p


@pytest.mark.parametrize("extra", [[], ["--colocate"], ["--actor-num-nodes", "1"], ["--actor-num-gpus-per-node", "0"],
                                   ["--actor-num-gpus-per-node", "1"], ["--rollout-num-gpus", "0"],
                                   ["--rollout-num-gpus-per-engine", "1"], ["--update-weights-interval", "2"]])
def test_honoured_cluster_values_pass(base, extra):
    cfg = parse_config(base + extra)
    if "--colocate" in extra:
        assert cfg.colocate and cfg.rollout_engine == "local"


def test_every_cluster_field_is_covered():
    """A new ClusterConfig field must be added to the tests above (honoured or refused)."""
    covered = {"colocate", "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus",
               "rollout_num_gpus_per_engine", "use_fault_tolerance", "update_weights_interval"}
    assert {f.name for f in dataclasses.fields(ClusterConfig)} == covered


def test_all_refusals_are_reported_together(base):
    ps = problems(base + ["--actor-num-nodes", "2", "--rollout-num-gpus", "4", "--use-fault-tolerance"])
    assert [p.split(" ", 1)[0].rstrip(":") for p in ps] == ["--actor-num-nodes", "--rollout-num-gpus",
                                                           "--use-fault-tolerance"]

"""Cluster flags: each is honoured or refused with a message naming it; none is silently ignored.
A value counts as set when it differs from the field's default. docs/cluster.md lists every refusal."""
import dataclasses

import pytest

from slick.config import ConfigError, parse_config
from slick.config.groups import ClusterConfig
from slick.config.validate import num_engine_actors, trainer_ranks
from tests.hf_dirs import write_model_dir

HTTP = ["--rollout-engine", "http", "--rollout-urls", "http://127.0.0.1:1"]


@pytest.fixture
def base(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    return ["--hf-checkpoint", str(write_model_dir(tmp_path / "model")), "--prompt-data", str(data)]


def problems(argv):
    with pytest.raises(ConfigError) as e:
        parse_config(argv)
    return e.value.problems


@pytest.mark.parametrize("extra,message", [
    (["--actor-num-nodes", "0"], "--actor-num-nodes 0: must be >= 1"),
    (["--actor-num-gpus-per-node", "-1"], "--actor-num-gpus-per-node -1: must be >= 0"),
    (["--actor-num-nodes", "2"], "--actor-num-nodes 2 needs --actor-num-gpus-per-node >= 1 (trainer ranks = "
                                 "nodes x GPUs per node"),
    (["--rollout-num-gpus", "-2"], "--rollout-num-gpus -2: must be >= 0"),
    (["--rollout-num-gpus-per-engine", "2"], "--rollout-num-gpus-per-engine 2: only 1 (slick's engine has no tensor "
                                             "parallelism): for tensor-parallel engines launch SGLang servers "
                                             "yourself and pass --rollout-engine http --rollout-urls URL ... (start "
                                             "each with --tp N)"),
    (["--rollout-num-gpus", "2"] + HTTP, "--rollout-num-gpus 2 starts slick's own engine actors, but "
                                         "--rollout-engine http uses HTTP servers: drop one of them"),
    (["--colocate"] + HTTP, "--colocate needs slick's own engines (--rollout-engine local, in process or as "
                            "actors): --rollout-engine http runs engines in processes of their own"),
    (["--colocate", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1"],
     "--colocate puts one engine on each trainer rank's bundle: --rollout-num-gpus 1 must equal the trainer ranks "
     "(2 = --actor-num-nodes 1 x --actor-num-gpus-per-node 2), or 0 for the in-process engine"),
    (["--weight-transport", "colocated"] + HTTP,
     "--weight-transport colocated needs engines that share the trainer's process or devices (the in-process "
     "engine, or --colocate): --rollout-engine http engines run elsewhere; use disk or broadcast"),
    (["--weight-transport", "colocated", "--rollout-num-gpus", "2"],
     "--weight-transport colocated needs engines that share the trainer's process or devices (the in-process "
     "engine, or --colocate): the 2 engine actors of --rollout-num-gpus without --colocate run elsewhere"),
    (["--weight-transport", "broadcast"], "--weight-transport broadcast needs engines in other processes "
                                          "(--rollout-num-gpus N, or --rollout-engine http)"),
    (["--weight-bucket-mb", "0"], "--weight-bucket-mb must be > 0 (got 0)"),
    (["--dist-timeout", "0"], "--dist-timeout must be > 0 (got 0.0)"),
    (["--ray-start-timeout", "-1"], "--ray-start-timeout must be > 0 (got -1.0)"),
    (["--ray-address", "localhost"], "--ray-address 'localhost': expected HOST:PORT of the cluster's GCS"),
    (["--ray-address", "127.0.0.1:99999"], "--ray-address '127.0.0.1:99999': expected HOST:PORT"),
    (["--use-fault-tolerance"], "--use-fault-tolerance: not supported yet"),
])
def test_each_impossible_cluster_setting_is_refused_by_name(base, extra, message):
    (p,) = problems(base + extra)
    assert p.startswith(message), p


def test_unknown_weight_transport_is_refused_by_argparse(base, capsys):
    with pytest.raises(SystemExit):
        parse_config(base + ["--weight-transport", "nccl"])
    assert "--weight-transport: invalid choice: 'nccl'" in capsys.readouterr().err


@pytest.mark.parametrize("extra,ranks,engines,transport", [
    ([], 1, 0, "colocated"),
    (["--colocate"], 1, 0, "colocated"),
    (["--actor-num-gpus-per-node", "1"], 1, 0, "colocated"),
    (["--actor-num-gpus-per-node", "2"], 2, 0, "colocated"),
    (["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4"], 8, 0, "colocated"),
    (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2"], 2, 2, "disk"),
    (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2", "--colocate"], 2, 2, "colocated"),
    (["--rollout-num-gpus", "3", "--weight-transport", "broadcast"], 1, 3, "broadcast"),
    (HTTP, 1, 0, "disk"),
    (HTTP + ["--weight-transport", "broadcast"], 1, 0, "broadcast"),
    (["--weight-transport", "disk"], 1, 0, "disk"),
    (["--weight-bucket-mb", "64", "--dist-timeout", "30", "--ray-start-timeout", "5"], 1, 0, "colocated"),
    (["--update-weights-interval", "2"], 1, 0, "colocated"),
])
def test_possible_layouts_pass_and_auto_transport_resolves(base, extra, ranks, engines, transport):
    cfg = parse_config(base + extra)
    assert (trainer_ranks(cfg), num_engine_actors(cfg), cfg.weight_transport) == (ranks, engines, transport)


@pytest.mark.parametrize("addr", ["auto", "127.0.0.1:6379", "ray://10.0.0.2:10001", "head-node:6379"])
def test_ray_address_forms(base, addr):
    assert parse_config(base + ["--ray-address", addr]).ray_address == addr


def test_ray_address_comes_from_the_environment_when_unset(base, monkeypatch):
    """`ray job submit` sets RAY_ADDRESS for the job's process; the flag wins over it."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6380")
    assert parse_config(base).ray_address == "127.0.0.1:6380"
    assert parse_config(base + ["--ray-address", "auto"]).ray_address == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "nonsense")
    (p,) = problems(base)
    assert p == ("--ray-address 'nonsense': expected HOST:PORT of the cluster's GCS (e.g. 127.0.0.1:6379, what `ray "
                 "start --head` prints), ray://HOST:PORT, or auto (from the RAY_ADDRESS environment variable)")


def test_without_address_or_environment_there_is_none(base):
    assert parse_config(base + ["--actor-num-gpus-per-node", "2"]).ray_address is None


def test_every_cluster_field_is_covered():
    """A new ClusterConfig field must be added to the tests above (honoured or refused)."""
    covered = {"ray_address", "colocate", "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus",
               "rollout_num_gpus_per_engine", "weight_transport", "weight_bucket_mb", "dist_timeout",
               "ray_start_timeout", "use_fault_tolerance", "update_weights_interval"}
    assert {f.name for f in dataclasses.fields(ClusterConfig)} == covered


def test_all_refusals_are_reported_together(base):
    ps = problems(base + ["--actor-num-nodes", "0", "--rollout-num-gpus-per-engine", "4", "--dist-timeout", "0",
                          "--use-fault-tolerance"])
    assert [p.split(" ", 1)[0].rstrip(":") for p in ps] == ["--actor-num-nodes", "--rollout-num-gpus-per-engine",
                                                           "--dist-timeout", "--use-fault-tolerance"]

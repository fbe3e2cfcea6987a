"""Cluster flags: each is honoured or refused with a message naming it; none is silently ignored.
A value counts as set when it differs from the field's default. docs/cluster.md lists every refusal."""
import dataclasses

import pytest

from slick.config import ConfigError
from slick.configure import parse_config
from slick.config.groups import ClusterConfig
from slick.configure.validate import num_engine_actors, trainer_ranks, uses_ray
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
    (["--rollout-num-gpus", "2"] + HTTP, "--rollout-num-gpus 2 starts slick's own engine actors, but --rollout-urls "
                                         "names servers to use: drop one of them"),
    (["--rollout-num-gpus", "2", "--rollout-engine", "http", "--rollout-num-workers", "2"],
     "--rollout-num-gpus 2 starts slick's own engine actors, but --rollout-num-workers 2 launches `slick serve` "
     "workers: drop one of them"),
    (["--colocate"] + HTTP, "--colocate needs slick's own engines (in process, or in the trainer ranks' actors): "
                            "--rollout-urls engines run in processes of their own"),
    (["--colocate", "--rollout-engine", "http"], "--colocate needs slick's own engines (in process, or in the "
                                                 "trainer ranks' actors): --rollout-engine http launches `slick "
                                                 "serve` workers in processes of their own"),
    (["--colocate", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1"],
     "--colocate runs one engine in each trainer rank's actor: --rollout-num-gpus 1 must be 0 or equal the 2 "
     "trainer rank(s) (--actor-num-nodes 1 x --actor-num-gpus-per-node 2)"),
    (["--weight-transport", "colocated"] + HTTP,
     "--weight-transport colocated needs engines that share the trainer's process (the in-process engine, or "
     "--colocate): --rollout-engine http engines run in processes of their own; use disk or broadcast"),
    (["--weight-transport", "colocated", "--rollout-num-gpus", "2"],
     "--weight-transport colocated needs engines that share the trainer's process (the in-process engine, or "
     "--colocate): the 2 engine actor(s) of --rollout-num-gpus without --colocate run in processes of their own"),
    (["--offload-rollout", "--rollout-num-gpus", "2"],
     "--offload-rollout frees the in-process engine's memory; engine actors (--rollout-num-gpus / --colocate on "
     "Ray) run in processes of their own"),
    (["--offload-rollout", "--rollout-engine", "http"],
     "--offload-rollout frees the in-process engine's memory; --rollout-engine http engines run in processes of "
     "their own"),
    (["--weight-bucket-mb", "0"], "--weight-bucket-mb must be > 0 (got 0)"),
    (["--dist-timeout", "0"], "--dist-timeout must be > 0 (got 0.0)"),
    (["--ray-start-timeout", "-1"], "--ray-start-timeout must be > 0 (got -1.0)"),
    (["--ray-address", "localhost"], "--ray-address 'localhost': expected HOST:PORT of the cluster's GCS"),
    (["--ray-address", "127.0.0.1:99999"], "--ray-address '127.0.0.1:99999': expected HOST:PORT"),
    (["--ray-address", "http://127.0.0.1:8265"], "--ray-address 'http://127.0.0.1:8265': that is the dashboard's "
                                                 "address, which `ray job submit --address` takes; slick joins the "
                                                 "cluster's GCS"),
    (["--use-fault-tolerance"], "--use-fault-tolerance restarts engine processes: it needs --rollout-engine http"),
    (["--rollout-health-check-interval", "0"], "--rollout-health-check-interval must be > 0 (got 0.0)"),
    (["--rollout-health-check-timeout", "-1"], "--rollout-health-check-timeout must be > 0 (got -1.0)"),
    (["--rollout-health-check-first-wait", "-1"], "--rollout-health-check-first-wait must be >= 0 (got -1.0)"),
    (["--rollout-engine", "http", "--rollout-urls", "http://127.0.0.1:1", "--use-fault-tolerance"],
     "--use-fault-tolerance restarts engines slick launched"),
    (["--rollout-engine", "http", "--use-fault-tolerance", "--weight-transport", "broadcast"],
     "--use-fault-tolerance brings a replacement engine to the current weights"),
])
def test_each_impossible_cluster_setting_is_refused_by_name(base, extra, message):
    (p,) = problems(base + extra)
    assert p.startswith(message), p


def test_unknown_weight_transport_is_refused_by_argparse(base, capsys):
    with pytest.raises(SystemExit):
        parse_config(base + ["--weight-transport", "nccl"])
    assert "--weight-transport: invalid choice: 'nccl'" in capsys.readouterr().err


@pytest.mark.parametrize("extra,ranks,engines,ray,transport", [
    ([], 1, 0, False, "colocated"),
    (["--colocate"], 1, 0, False, "colocated"),
    (["--actor-num-gpus-per-node", "1"], 1, 0, False, "colocated"),
    (["--weight-transport", "disk"], 1, 0, False, "disk"),
    (["--weight-transport", "broadcast"], 1, 0, False, "broadcast"),     # the in-process engine joins in a thread
    (["--ray-address", "auto"], 1, 0, True, "colocated"),
    (["--ray-address", "auto", "--colocate"], 1, 1, True, "colocated"),
    (["--actor-num-gpus-per-node", "2"], 2, 0, True, "colocated"),
    (["--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4"], 8, 0, True, "colocated"),
    (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2"], 2, 2, True, "disk"),
    (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "3", "--rollout-engine", "http"], 2, 3, True, "disk"),
    (["--actor-num-gpus-per-node", "2", "--colocate"], 2, 2, True, "colocated"),
    (["--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2", "--colocate"], 2, 2, True, "colocated"),
    (["--actor-num-gpus-per-node", "2", "--colocate", "--rollout-engine", "http"], 2, 2, True, "colocated"),
    (["--actor-num-gpus-per-node", "2", "--colocate", "--weight-transport", "disk"], 2, 2, True, "disk"),
    (["--rollout-num-gpus", "3", "--weight-transport", "broadcast"], 1, 3, True, "broadcast"),
    (HTTP, 1, 0, False, "disk"),
    (HTTP + ["--weight-transport", "broadcast"], 1, 0, False, "broadcast"),
    (["--weight-bucket-mb", "64", "--dist-timeout", "30", "--ray-start-timeout", "5"], 1, 0, False, "colocated"),
    (["--update-weights-interval", "2"], 1, 0, False, "colocated"),
    (["--offload-rollout", "--update-weights-interval", "2"], 1, 0, False, "colocated"),
    (["--offload-rollout", "--actor-num-gpus-per-node", "2"], 2, 0, True, "colocated"),
])
def test_possible_layouts_pass_and_auto_transport_resolves(base, extra, ranks, engines, ray, transport):
    cfg = parse_config(base + extra)
    assert (trainer_ranks(cfg), num_engine_actors(cfg), uses_ray(cfg), cfg.weight_transport) == (
        ranks, engines, ray, transport)


@pytest.mark.parametrize("addr", ["auto", "127.0.0.1:6379", "ray://10.0.0.2:10001", "head-node:6379"])
def test_ray_address_forms(base, addr):
    assert parse_config(base + ["--ray-address", addr]).ray_address == addr


def test_ray_address_environment_alone_does_not_send_a_one_process_run_to_ray(base, monkeypatch):
    """`ray job submit` sets RAY_ADDRESS for the job's process: it says which cluster a multi-process layout joins;
    a one-process run stays in the job's process (slick.cluster reads RAY_ADDRESS when it connects)."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6380")
    cfg = parse_config(base)
    assert (cfg.ray_address, uses_ray(cfg)) == (None, False)
    assert uses_ray(parse_config(base + ["--actor-num-gpus-per-node", "2"]))


def test_every_cluster_field_is_covered():
    """A new ClusterConfig field must be added to the tests above (honoured or refused)."""
    covered = {"ray_address", "colocate", "actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus",
               "rollout_num_gpus_per_engine", "weight_transport", "weight_bucket_mb", "dist_timeout",
               "ray_start_timeout", "use_fault_tolerance", "update_weights_interval", "offload_rollout",
               "rollout_health_check_interval", "rollout_health_check_timeout", "rollout_health_check_first_wait"}
    assert {f.name for f in dataclasses.fields(ClusterConfig)} == covered


def test_all_refusals_are_reported_together(base):
    ps = problems(base + ["--actor-num-nodes", "0", "--rollout-num-gpus-per-engine", "4", "--dist-timeout", "0",
                          "--use-fault-tolerance"])
    assert [p.split(" ", 1)[0].rstrip(":") for p in ps] == ["--actor-num-nodes", "--rollout-num-gpus-per-engine",
                                                           "--dist-timeout", "--use-fault-tolerance"]

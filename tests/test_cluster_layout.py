"""Ray layout planning (slick.cluster.layout): slots, bundles, ranks, engines, threads; no Ray needed."""
import pytest

from slick.cluster.layout import (LayoutError, plan, plan_from_config, shortfall, slots_per_node,
                                  threads_per_actor, trainer_ranks, uses_ray)
from slick.config import Config


def test_disaggregated_cpu_layout_gives_engines_their_own_slots_after_the_trainer():
    lay = plan(1, 2, 2)
    assert lay.trainer_ranks == 2 and lay.num_engines == 2 and not lay.colocate
    assert lay.bundles == [{"CPU": 1}] * 4
    assert lay.trainer_bundles == [0, 1] and lay.engine_bundles == [2, 3]
    assert lay.slots == 4 and lay.processes == 4
    assert lay.actor_resources() == {"num_cpus": 1, "num_gpus": 0}
    assert lay.describe() == "4 CPU slot(s): 2 trainer rank(s), 2 engine(s) on 2 CPU slot(s) of their own"


def test_gpu_layout_uses_one_gpu_bundle_per_slot_and_nodes_multiply_ranks():
    lay = plan(2, 4, 8, use_gpu=True)
    assert lay.trainer_ranks == 8 and lay.num_engines == 8
    assert lay.bundles == [{"GPU": 1, "CPU": 1}] * 16
    assert lay.trainer_bundles == list(range(8)) and lay.engine_bundles == list(range(8, 16))
    assert lay.actor_resources() == {"num_cpus": 1, "num_gpus": 1}


def test_colocate_puts_one_engine_in_each_rank_and_takes_no_extra_slot():
    lay = plan(1, 2, 0, colocate=True)
    assert lay.trainer_ranks == 2 and lay.num_engines == 2 and lay.colocate
    assert lay.bundles == [{"CPU": 1}] * 2 and lay.engine_bundles == [None, None]
    assert lay.processes == 2
    assert plan(1, 2, 2, colocate=True).num_engines == 2     # the same, spelled out


def test_no_engine_slots_means_no_engine_actors():
    lay = plan(1, 2, 0)
    assert lay.num_engines == 0 and lay.slots == 2 and lay.engine_bundles == []


@pytest.mark.parametrize("args, kwargs, words", [
    ((1, 2, 3), {"colocate": True}, ["--colocate", "--rollout-num-gpus 3", "2 trainer slot(s)"]),
    ((1, 1, 2, 2), {}, ["--rollout-num-gpus-per-engine 2", "tensor parallelism", "--rollout-urls"]),
    ((0, 1, 0), {}, ["--actor-num-nodes 0"]),
    ((1, -1, 0), {}, ["--actor-num-gpus-per-node -1"]),
    ((1, 1, -2), {}, ["--rollout-num-gpus -2"]),
])
def test_layouts_that_cannot_run_are_refused_naming_the_flags(args, kwargs, words):
    with pytest.raises(LayoutError) as e:
        plan(*args, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_threads_rule_never_oversubscribes_a_node():
    assert threads_per_actor(2, 4) == 1          # more slots than cores: one thread each, never 0
    assert threads_per_actor(16, 4) == 4
    assert threads_per_actor(17, 4) == 4         # floor: 4 x 4 <= 17
    assert threads_per_actor(8, 1) == 8
    for cores in range(1, 33):
        for slots in range(1, cores + 1):
            assert threads_per_actor(cores, slots) * slots <= cores
    with pytest.raises(ValueError, match="slots_on_node"):
        threads_per_actor(8, 0)


def test_slots_per_node_counts_bundles_by_node():
    assert slots_per_node(["a", "b", "a", "a"]) == {"a": 3, "b": 1}


def test_shortfall_names_what_is_asked_and_what_the_cluster_has():
    bundles = plan(1, 4, 2).bundles
    assert shortfall(bundles, {"CPU": 6.0}) is None
    assert shortfall(bundles, {"CPU": 4.0}) == "CPU 6 asked, 4 in the cluster"
    assert shortfall(plan(1, 1, 1, use_gpu=True).bundles, {"CPU": 8.0}) == "GPU 2 asked, 0 in the cluster"


def test_config_decides_ranks_and_whether_ray_is_used(monkeypatch):
    cfg = Config.from_flat({})
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")      # alone, it keeps a one-process run local
    assert trainer_ranks(cfg) == 1 and not uses_ray(cfg)
    cfg.actor_num_gpus_per_node = 2
    assert trainer_ranks(cfg) == 2 and uses_ray(cfg)
    cfg = Config.from_flat({"rollout_num_gpus": 1})
    assert uses_ray(cfg)
    cfg = Config.from_flat({"ray_address": "auto"})
    assert uses_ray(cfg)
    cfg = Config.from_flat({"actor_num_nodes": 2, "actor_num_gpus_per_node": 2, "colocate": True})
    lay = plan_from_config(cfg, use_gpu=True)
    assert lay.trainer_ranks == 4 and lay.num_engines == 4 and lay.bundles == [{"GPU": 1, "CPU": 1}] * 4

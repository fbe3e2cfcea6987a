"""Where every process of a Ray run goes: slots, placement-group bundles, trainer ranks, engines, threads.

Pure planning (no Ray import), so that every rule here is tested without a cluster. slime's layout:

* one placement group of *slots*, one bundle per slot. On GPUs a slot is one GPU (bundle
  ``{"GPU": 1, "CPU": 1}``); on a machine without GPUs each "GPU" of the flags is one CPU slot (bundle
  ``{"CPU": 1}``).
* trainer ranks = ``--actor-num-nodes`` x ``--actor-num-gpus-per-node``, one actor per rank, rank r on
  bundle r.
* engines = ``--rollout-num-gpus`` / ``--rollout-num-gpus-per-engine``. Disaggregated (the default): the
  engines get bundles of their own, after the trainer's. ``--colocate``: no bundles of their own; engine i
  runs inside trainer rank i's actor process (one engine per rank), so weights are handed over in-process.
* threads per actor: ``max(1, node_cores // slots_on_that_node)``, so the ranks and engines of one node
  never ask for more OpenMP threads than it has cores (a colocated engine shares its rank's threads: it
  generates while the trainer waits).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from slick.config import Config, ConfigView
from slick.types import ClusterFailure  # noqa: F401 - a name of this module: cluster failures start here


class LayoutError(ValueError):
    """A cluster layout that cannot run; the message names the flags."""


@dataclass(frozen=True)
class Layout:
    """The plan: ``bundles[i]`` is slot i's resources; trainer rank r sits on ``trainer_bundles[r]``;
    disaggregated engine e on ``engine_bundles[e]`` (``None`` when colocated: in rank e's actor)."""

    trainer_ranks: int
    num_engines: int
    colocate: bool
    use_gpu: bool
    bundles: list = field(default_factory=list)
    trainer_bundles: list = field(default_factory=list)
    engine_bundles: list = field(default_factory=list)

    @property
    def slots(self) -> int:
        return len(self.bundles)

    @property
    def processes(self) -> int:
        """Ray actors this layout starts (a colocated engine lives in its rank's actor)."""
        return self.trainer_ranks + (0 if self.colocate else self.num_engines)

    def actor_resources(self) -> dict:
        """Resources one actor asks of its bundle (all of it: one actor per bundle)."""
        return {"num_cpus": 1, "num_gpus": 1 if self.use_gpu else 0}

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU"
        where = ("colocated in the trainer ranks' actors" if self.colocate
                 else f"on {self.num_engines} {kind} slot(s) of their own")
        return (f"{self.slots} {kind} slot(s): {self.trainer_ranks} trainer rank(s), "
                f"{self.num_engines} engine(s) {where}")


def trainer_ranks(cfg: Config | ConfigView) -> int:
    """--actor-num-nodes x --actor-num-gpus-per-node; 0 GPUs per node means one rank (the one-process trainer)."""
    return max(1, cfg.actor_num_nodes) * max(1, cfg.actor_num_gpus_per_node)


def plan(actor_num_nodes: int, actor_num_gpus_per_node: int, rollout_num_gpus: int,
         rollout_num_gpus_per_engine: int = 1, colocate: bool = False, use_gpu: bool = False) -> Layout:
    """The layout for these flags, or :class:`LayoutError` naming the flags when it cannot run.

    ``rollout_num_gpus`` 0 with ``colocate``: one engine per trainer rank; 0 without: no engine actors (the
    rollout engine is the one ``--rollout-engine`` picks, outside the placement group)."""
    problems = []
    if actor_num_nodes < 1:
        problems.append(f"--actor-num-nodes {actor_num_nodes}: needs at least 1")
    if actor_num_gpus_per_node < 0:
        problems.append(f"--actor-num-gpus-per-node {actor_num_gpus_per_node}: cannot be negative")
    if rollout_num_gpus < 0:
        problems.append(f"--rollout-num-gpus {rollout_num_gpus}: cannot be negative")
    if rollout_num_gpus_per_engine != 1:
        problems.append(f"--rollout-num-gpus-per-engine {rollout_num_gpus_per_engine}: slick's engine has no "
                        f"tensor parallelism, so each engine takes exactly 1 slot (start SGLang servers with the "
                        f"size you want and pass --rollout-engine http --rollout-urls)")
    if problems:
        raise LayoutError("; ".join(problems))
    ranks = actor_num_nodes * max(1, actor_num_gpus_per_node)
    if colocate:
        engines = rollout_num_gpus or ranks
        if engines != ranks:
            raise LayoutError(f"--colocate runs one engine inside each trainer rank: --rollout-num-gpus "
                              f"{rollout_num_gpus} must be 0 or equal to the {ranks} trainer slot(s) "
                              f"(--actor-num-nodes {actor_num_nodes} x --actor-num-gpus-per-node "
                              f"{actor_num_gpus_per_node})")
    else:
        engines = rollout_num_gpus // rollout_num_gpus_per_engine
    bundle = {"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1}
    slots = ranks + (0 if colocate else engines)
    return Layout(trainer_ranks=ranks, num_engines=engines, colocate=colocate, use_gpu=use_gpu,
                  bundles=[dict(bundle) for _ in range(slots)], trainer_bundles=list(range(ranks)),
                  engine_bundles=[None] * engines if colocate else list(range(ranks, ranks + engines)))


def plan_from_config(cfg: Config | ConfigView, use_gpu: bool) -> Layout:
    return plan(cfg.actor_num_nodes, cfg.actor_num_gpus_per_node, cfg.rollout_num_gpus,
                cfg.rollout_num_gpus_per_engine, cfg.colocate, use_gpu)


def uses_ray(cfg: Config | ConfigView) -> bool:
    """A run goes to Ray when --ray-address is given or it asks for more than one process (several trainer
    ranks, or engine slots of its own). RAY_ADDRESS alone only says which cluster to join then."""
    return bool(cfg.ray_address) or trainer_ranks(cfg) > 1 or cfg.rollout_num_gpus > 0


def threads_per_actor(node_cores: int, slots_on_node: int) -> int:
    """torch threads of each actor on a node: ``max(1, node_cores // slots_on_node)`` (no oversubscription)."""
    if slots_on_node < 1:
        raise ValueError(f"slots_on_node must be >= 1 (got {slots_on_node})")
    return max(1, int(node_cores) // int(slots_on_node))


def slots_per_node(bundle_nodes: list) -> dict:
    """{node id: number of this layout's bundles placed on it} from the placement group's bundle -> node map."""
    out: dict = {}
    for node in bundle_nodes:
        out[node] = out.get(node, 0) + 1
    return out


def shortfall(bundles: list, available: dict) -> Optional[str]:
    """None when ``available`` (Ray's cluster resources) can hold ``bundles`` in total, else what is missing."""
    need: dict = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0) + v
    missing = [f"{k} {v:g} asked, {available.get(k, 0):g} in the cluster" for k, v in sorted(need.items())
               if available.get(k, 0) < v]
    return "; ".join(missing) or None

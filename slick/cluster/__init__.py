"""slick on a Ray cluster: the layout (pure planning), the cluster and its placement group, trainer ranks as
actors (:class:`RayTrainerGroup`), and engine actors serving `slick serve`'s API. See docs/cluster.md."""
from __future__ import annotations

from typing import Optional

from slick.cluster.layout import ClusterFailure, Layout, LayoutError, plan_from_config, trainer_ranks, uses_ray
from slick.cluster.ray_cluster import RayCluster, _cores
from slick.config import Config, ConfigView

__all__ = ["ClusterFailure", "Layout", "LayoutError", "plan_from_config", "start_cluster", "trainer_ranks", "uses_ray"]


def _wants_gpu(cfg: ConfigView, cluster_has_gpus: bool) -> bool:
    return cluster_has_gpus and cfg.device in ("auto", "cuda")


def start_cluster(cfg: Config | ConfigView) -> Optional["RayCluster"]:
    """None when the run needs no Ray (:func:`uses_ray`); else a joined or local cluster with the run's
    placement group ready (within --ray-start-timeout). Stops what it started when placing fails."""
    cfg = cfg.view("cluster", "train")
    if not uses_ray(cfg):
        return None

    cpu_plan = plan_from_config(cfg, use_gpu=False)       # refuses impossible flags before Ray starts
    cluster = RayCluster.connect(cfg, num_cpus=max(_cores(), cpu_plan.slots))
    try:
        layout = plan_from_config(cfg, use_gpu=_wants_gpu(cfg, cluster.has_gpus()))
        cluster.place(layout, float(cfg.ray_start_timeout))
    except BaseException:
        cluster.stop()
        raise
    return cluster

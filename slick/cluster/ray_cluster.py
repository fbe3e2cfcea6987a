"""The Ray cluster of a run: join one (--ray-address ADDR|auto, or RAY_ADDRESS as under `ray job submit`) or
start a local one bound to 127.0.0.1 with its own temp dir; one placement group for the layout, ready within
a timeout whose error names what was asked and what the cluster has. :meth:`RayCluster.stop` removes the
placement group and stops the cluster only when slick started it."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from typing import Optional

from slick.cluster.layout import ClusterFailure, Layout, shortfall, slots_per_node

log = logging.getLogger("slick.cluster")

# what every actor's process needs to find slick's files and stay offline
WORKER_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SLICK_CACHE", "SLICK_NATIVE", "CXX", "PYTHONPATH")


class ClusterError(ClusterFailure):
    """The cluster cannot hold the layout, or did not answer in time."""


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_env() -> dict:
    """Environment variables the actors get (slick's root on PYTHONPATH; offline Hugging Face)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: os.environ[k] for k in WORKER_ENV if k in os.environ}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def without_job_env_keys(env: dict) -> dict:
    """Under `ray job submit` Ray merges the job's runtime env into ray.init's and refuses a key both set: the
    job's value (the user's ``--runtime-env-json``) wins, slick sends only the other keys."""
    try:
        job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    except ValueError:
        return env
    taken = ((job.get("runtime_env") or {}).get("env_vars") or {}) if isinstance(job, dict) else {}
    return {k: v for k, v in env.items() if k not in taken}


class RayCluster:
    """A connection to Ray plus this run's placement group.

    ``address``: what was joined ("local" when slick started the cluster). ``started_here``: slick started it
    (and :meth:`stop` shuts it down). ``owned_init``: this object called ``ray.init`` (else Ray was already
    initialised in this process, e.g. by a test or a notebook, and is left as it was)."""

    def __init__(self, address: str, started_here: bool, owned_init: bool, temp_dir: Optional[str] = None):
        self.address, self.started_here, self.owned_init, self.temp_dir = address, started_here, owned_init, temp_dir
        self.pg = None
        self.layout: Optional[Layout] = None
        self.bundle_nodes: list = []
        self.start_seconds = 0.0

    # ------------------------------------------------------------------ connect
    @classmethod
    def connect(cls, cfg, num_cpus: Optional[int] = None) -> "RayCluster":
        """Join ``cfg.ray_address`` (or RAY_ADDRESS); without either, start a local cluster with
        ``num_cpus`` logical CPUs (default: this machine's cores) on 127.0.0.1 in its own temp dir."""
        import ray

        t0 = time.perf_counter()
        if ray.is_initialized():
            c = cls(ray.get_runtime_context().gcs_address, started_here=False, owned_init=False)
        else:
            address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
            runtime_env = {"env_vars": without_job_env_keys(worker_env())}
            if address:
                try:
                    ray.init(address=address, runtime_env=runtime_env, log_to_driver=True,
                             logging_level=logging.WARNING)
                except Exception as e:  # noqa: BLE001 - Ray raises several kinds here
                    src = "--ray-address" if cfg.ray_address else "RAY_ADDRESS"
                    raise ClusterError(f"{src} {address}: cannot join the Ray cluster there ({e}); start one "
                                       f"with `ray start --head` or leave it unset to let slick start a local "
                                       f"one") from e
                c = cls(address, started_here=False, owned_init=True)
            else:
                temp_dir = tempfile.mkdtemp(prefix="slick-ray-", dir="/tmp")
                ray.init(address="local", num_cpus=num_cpus or _cores(), num_gpus=None,
                         include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp_dir,
                         runtime_env=runtime_env, log_to_driver=True, logging_level=logging.WARNING)
                c = cls("local", started_here=True, owned_init=True, temp_dir=temp_dir)
                log.info("started a local Ray cluster (%s CPUs, temp dir %s)", num_cpus or _cores(), temp_dir)
        c.start_seconds = time.perf_counter() - t0
        return c

    @staticmethod
    def has_gpus() -> bool:
        import ray

        return ray.cluster_resources().get("GPU", 0) > 0

    # ------------------------------------------------------------------ placement
    def place(self, layout: Layout, timeout_s: float) -> None:
        """Create the placement group for ``layout`` and wait for it, at most ``timeout_s`` seconds."""
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        self.layout = layout
        total, free = ray.cluster_resources(), ray.available_resources()
        asked = f"{layout.describe()} ({len(layout.bundles)} bundle(s) {layout.bundles[0] if layout.bundles else {}})"
        missing = shortfall(layout.bundles, total)
        if missing:
            raise ClusterError(f"the Ray cluster at {self.address} cannot hold this run: asked for {asked}; "
                               f"{missing} (cluster total {_fmt(total)}). Ask for fewer slots "
                               f"(--actor-num-gpus-per-node, --rollout-num-gpus) or add nodes")
        self.pg = placement_group(layout.bundles, strategy="PACK", name=f"slick-{os.getpid()}-{time.time_ns()}")
        if not self.pg.wait(timeout_seconds=timeout_s):
            pg, self.pg = self.pg, None
            ray.util.remove_placement_group(pg)
            raise ClusterError(f"placement group not ready within {timeout_s:g}s: asked for {asked}; the cluster "
                               f"at {self.address} has {_fmt(total)} in total, {_fmt(free)} free (other jobs "
                               f"hold the rest?)")
        table = placement_group_table(self.pg)
        nodes = table.get("bundles_to_node_id", {})
        self.bundle_nodes = [nodes.get(i) for i in range(len(layout.bundles))]

    def slots_on_node_of(self, bundle: int) -> int:
        """How many of this run's slots share bundle ``bundle``'s node."""
        return slots_per_node(self.bundle_nodes)[self.bundle_nodes[bundle]]

    def strategy(self, bundle: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=bundle,
                                                placement_group_capture_child_tasks=True)

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Remove the placement group; shut Ray down when this object initialised it (and the local cluster
        with it, when slick started one). Idempotent."""
        import ray

        if self.pg is not None and ray.is_initialized():
            try:
                ray.util.remove_placement_group(self.pg)
            except Exception as e:  # noqa: BLE001 - best effort while stopping
                log.warning("removing the placement group: %s", e)
            self.pg = None
        if self.owned_init and ray.is_initialized():
            ray.shutdown()
            self.owned_init = False
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def _fmt(resources: dict) -> str:
    keys = [k for k in ("CPU", "GPU") if k in resources] or sorted(resources)[:3]
    return ", ".join(f"{k} {resources.get(k, 0):g}" for k in keys) or "nothing"

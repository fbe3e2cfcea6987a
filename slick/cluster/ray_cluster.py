"""The Ray cluster of a run: join one (--ray-address ADDR|auto, or RAY_ADDRESS as under `ray job submit`) or
start a local one with its own temp dir whose every socket (GCS, raylet, object manager, dashboard and its
agent, runtime-env agent, metrics, workers, the driver) listens on 127.0.0.1 only; one placement group for
the layout, ready within a timeout whose error names what was asked and what the cluster has.
:meth:`RayCluster.stop` removes the placement group and stops the cluster only when slick started it."""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from typing import Optional

from slick.cluster.layout import ClusterFailure, Layout, shortfall, slots_per_node
from slick.config import Config, ConfigView

log = logging.getLogger("slick.cluster")

# what every actor's process needs to find slick's files and stay offline
WORKER_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "SLICK_CACHE", "SLICK_NATIVE", "CXX", "PYTHONPATH")
LOOPBACK = ("127.0.0.1", "::1")


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


@contextmanager
def _loopback_node():
    """While starting the local cluster, keep its node address 127.0.0.1. Ray binds its gRPC servers (GCS,
    raylet, workers) and agents to loopback only when the node address is literally 127.0.0.1, but ray.init
    rewrites a loopback ``_node_ip_address`` to this machine's routable address, except when multi-node
    clusters are off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read once into
    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER``); that switch is turned off here for the start only
    (a local cluster has one node) and restored after. The processes Ray starts get the address on their
    command lines."""
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):     # another Ray: _check_loopback says what it did
        yield
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def _check_loopback() -> None:
    """Say loudly when the local cluster's node is not on 127.0.0.1 (a Ray upgrade changed how it binds)."""
    import ray

    ip = ray._private.worker.global_worker.node.node_ip_address
    if ip not in LOOPBACK:
        log.warning("the local Ray cluster's node address is %s, not 127.0.0.1: its sockets may listen on every "
                    "interface, without authentication unless Ray's token auth is on (see docs/security.md)", ip)


def _cause(e: BaseException) -> str:
    """The innermost message of an exception chain (Ray wraps the reason a join failed in a generic one)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]


def _join(address: str, src: str, timeout_s: float, runtime_env: dict) -> None:
    """``ray.init(address)`` within ``timeout_s``. Ray rewrites a loopback host to this node's IP and, left alone,
    retries an unreachable GCS for many minutes; so the GCS port is probed at the address Ray will use first, and
    a join that fails is tried again until the deadline (a head that has just started may not have registered
    its node yet). The error names the address given, the one Ray used and the last reason."""
    import socket

    import ray
    from ray._private.services import canonicalize_bootstrap_address

    resolved, probe = address, None
    if not address.startswith("ray://"):     # a Ray client address is not a GCS: ray.init alone connects it
        try:   # "auto" is looked up among this machine's clusters; ray.init below says when there is none
            resolved = canonicalize_bootstrap_address(address) or address
        except Exception:  # noqa: BLE001
            pass
        host, _, port = resolved.rpartition(":")
        probe = (host.strip("[]"), int(port)) if port.isdigit() else None
    via = f" (Ray resolves it to {resolved})" if resolved != address else ""
    deadline, attempts, last = time.monotonic() + timeout_s, 0, "no answer"
    while True:
        attempts += 1
        try:
            if probe:
                socket.create_connection(probe, timeout=min(5.0, timeout_s)).close()
        except OSError as e:
            last = f"its GCS port does not answer: {e}"
        else:
            try:
                ray.init(address=address, runtime_env=runtime_env, log_to_driver=True, logging_level=logging.WARNING)
                return
            except Exception as e:  # noqa: BLE001 - Ray raises several kinds here
                last = f"{e} ({_cause(e)})" if _cause(e) != str(e) else str(e)
                if ray.is_initialized():
                    ray.shutdown()
        if time.monotonic() + 2.0 > deadline:
            raise ClusterError(f"{src} {address}: cannot join the Ray cluster there{via} within {timeout_s:g}s "
                               f"(--ray-start-timeout; {attempts} attempt(s), last: {last}); start one with "
                               f"`ray start --head` or leave it unset to let slick start a local one")
        log.warning("%s %s: joining the Ray cluster failed (%s); trying again", src, address, last)
        time.sleep(2.0)


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
    def connect(cls, cfg: Config | ConfigView, num_cpus: Optional[int] = None) -> "RayCluster":
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
                src = "--ray-address" if cfg.ray_address else "RAY_ADDRESS"
                _join(address, src, float(cfg.ray_start_timeout), runtime_env)
                c = cls(address, started_here=False, owned_init=True)
            else:
                temp_dir = tempfile.mkdtemp(prefix="slick-ray-", dir="/tmp")
                with _loopback_node():      # every socket on 127.0.0.1; other machines: --ray-address
                    ray.init(address="local", num_cpus=num_cpus or _cores(), num_gpus=None,
                             include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp_dir,
                             runtime_env=runtime_env, log_to_driver=True, logging_level=logging.WARNING)
                _check_loopback()
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

"""The local Ray cluster slick starts listens on loopback only (issue 30, finding 2): every listening TCP socket
of its processes (GCS, raylets, dashboard and agents, runtime-env agent, autoscaler monitor, workers, an actor,
the driver's own core worker) is on 127.0.0.1 / ::1. Ray has no authentication by default, so a socket on
0.0.0.0 or the machine's address lets anyone on the network run code as the user."""
import ipaddress
import os
import time
from pathlib import Path

import psutil
import pytest

from slick.cluster.ray_cluster import RayCluster
from slick.config import Config


def _is_loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip.split("%")[0])
    if a.version == 6 and a.ipv4_mapped is not None:      # ::ffff:127.0.0.1 (a dual-stack socket bound to 127.0.0.1)
        a = a.ipv4_mapped
    return a.is_loopback


def _descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _naming(needle: str) -> set[int]:
    out = set()
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(needle in a for a in (p.info["cmdline"] or [])):
                out.add(p.pid)
        except psutil.Error:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _listening(pids: set[int]) -> list[tuple[str, int, str, int]]:
    """(ip, port, process name, pid) of every listening TCP socket owned by ``pids``."""
    out = []
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            try:
                name = psutil.Process(c.pid).name()
            except psutil.Error:
                name = "?"
            out.append((c.laddr.ip, c.laddr.port, name, c.pid))
    return out


def test_every_socket_of_the_local_ray_cluster_listens_on_loopback_only(monkeypatch):
    import ray

    assert not ray.is_initialized(), "another test left Ray initialised in this process"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    me = os.getpid()
    before_children = _descendants()
    before_driver = {(ip, port) for ip, port, _, _ in _listening({me})}
    cluster = RayCluster.connect(Config.from_flat({"ray_address": None, "ray_start_timeout": 60.0}), num_cpus=2)
    pids: set[int] = set()
    try:
        assert cluster.started_here and cluster.temp_dir

        @ray.remote(num_cpus=1)
        class Probe:
            def pid(self):
                return os.getpid()

        actor = Probe.remote()
        actor_pid = ray.get(actor.pid.remote(), timeout=60)

        @ray.remote(num_cpus=1)
        def task_pid():
            return os.getpid()

        task_pids = set(ray.get([task_pid.remote() for _ in range(2)], timeout=60))
        # the agents bind a little after start-up: wait (bounded) until every kind of Ray server listens
        wanted = {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}
        deadline, socks = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            pids = (_descendants() - before_children) | _naming(cluster.temp_dir)
            socks = [s for s in _listening(pids | {me}) if s[3] != me or (s[0], s[1]) not in before_driver]
            names, owners = {s[2] for s in socks}, {s[3] for s in socks}
            if wanted <= names and actor_pid in owners and me in owners and task_pids & owners:
                break
            time.sleep(0.5)
        names, owners = {s[2] for s in socks}, {s[3] for s in socks}
        assert wanted <= names, f"not every Ray server was seen listening: {sorted(names)}"
        assert actor_pid in owners and me in owners and task_pids & owners, socks
        exposed = sorted((f"{ip}:{port}", name) for ip, port, name, _ in socks if not _is_loopback(ip))
        assert exposed == [], f"Ray sockets listening beyond loopback: {exposed} (all: {sorted(socks)})"
        assert len(socks) >= 8, socks
        assert ray._private.worker.global_worker.node.node_ip_address == "127.0.0.1"
    finally:
        temp_dir = cluster.temp_dir
        cluster.stop()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    left = [p for p in pids if _alive(p)]
    assert left == [], f"Ray processes outlived the cluster: {left}"
    assert not Path(temp_dir).exists()


def _listening_after_all_reduce(rank, world):
    import torch
    import torch.distributed as dist
    t = torch.ones(4)
    dist.all_reduce(t)          # gloo's pair sockets are up once a collective has run
    mine = sorted({(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp")
                   if c.status == psutil.CONN_LISTEN})
    dist.barrier()              # rank 0's store stays up until every rank has looked
    return {"sum": t.tolist(), "listening": mine}


def test_trainer_ranks_rendezvous_and_gloo_listen_on_loopback_only(tmp_path):
    """Trainer ranks on 127.0.0.1 (slick/proc/dist.py): rank 0's TCPStore and gloo's sockets listen on loopback,
    not on '::' (what torch's own bind picks whatever address it is given)."""
    from tests.test_train_fsdp import run_ranks
    res = run_ranks(_listening_after_all_reduce, 2, (), tmp_path)
    assert [r["sum"] for r in res] == [[2.0] * 4, [2.0] * 4]
    assert res[0]["listening"], "rank 0 should be listening (the rendezvous store)"
    exposed = [(rank, ip, port) for rank, r in enumerate(res) for ip, port in r["listening"] if not _is_loopback(ip)]
    assert exposed == []

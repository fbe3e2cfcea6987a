"""A real Ray head for tests: ``ray start --head --block`` on free 127.0.0.1 ports, in a temp dir of its own.

Every port Ray lets us pin is a free loopback port picked here (GCS, dashboard, node manager, object manager,
Ray client server, dashboard agent listen/gRPC, runtime-env agent, metrics export, and the workers' port list),
so parallel test sessions never collide on Ray's fixed defaults (6379, 8265, 10001, ...). Start-up is waited
for with a bound; :meth:`RayHead.stop` ends exactly this cluster: the ``ray start`` process group, then every
process whose command line names this head's temp dir or GCS address (raylet, GCS, dashboard, agents, workers),
SIGTERM first and SIGKILL after a grace period. It never runs ``ray stop`` (which would stop every cluster on
the machine). A test process killed before it can stop the head (SIGKILL, or SIGTERM, which runs no teardown) does
not leave the cluster behind: a reaper started with the head (this file run as a script) waits for the test
process to go, then ends the cluster the same way and removes its temp dir.

Use as a context manager::

    with RayHead(num_cpus=2) as head:
        head.gcs_address      # "127.0.0.1:PORT"   (ray.init(address=...), slick --ray-address)
        head.dashboard_url    # "http://127.0.0.1:PORT" (ray job submit --address ...)
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Optional

RAY = str(Path(sys.executable).with_name("ray"))
PORT_FLAGS = ("--port", "--dashboard-port", "--node-manager-port", "--object-manager-port",
              "--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--runtime-env-agent-port", "--metrics-export-port")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now (sockets held open together so none repeats)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def auth_token(env: dict) -> Optional[str]:
    """The Ray auth token clients on this machine would send: RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH, or
    ~/.ray/auth_token (None when there is none)."""
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"].strip()
    path = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids_matching(needles: list[str]) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmd = _cmdline(int(entry.name))
            if any(n in cmd for n in needles):
                out.append(int(entry.name))
    return out


def cluster_pids(sid: Optional[int], needles: list) -> list[int]:
    """Live processes of one cluster: the session ``sid`` (``ray start``'s) and every process whose command line
    names one of ``needles`` (its temp dir, its GCS address)."""
    found = set()
    if sid is not None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getsid(int(entry.name)) == sid:
                        found.add(int(entry.name))
                except OSError:
                    pass
    found.update(_pids_matching([n for n in needles if n]))
    found.discard(os.getpid())
    return sorted(p for p in found if _alive(p))


def end_processes(pids_of, grace_s: float, poll=None) -> list[int]:
    """SIGTERM every pid ``pids_of()`` names, SIGKILL what is left after ``grace_s``; returns the pids still
    alive after that (``poll``: called while waiting, to reap a child)."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = pids_of()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            if poll is not None:
                poll()
            time.sleep(0.1)
    return pids_of()


def reap_when_orphaned(parent: int, sid: int, temp_dir: str, gcs_address: str, poll_s: float = 0.5) -> None:
    """The reaper's body: once ``parent`` (the test process) is gone, end the cluster and remove its temp dir."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    end_processes(lambda: cluster_pids(sid, [temp_dir, gcs_address]), grace_s=10.0)
    shutil.rmtree(temp_dir, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"     # a zombie has already exited


class RayHead:
    """One Ray head node on 127.0.0.1 (see the module docstring)."""

    def __init__(self, num_cpus: int = 2, worker_ports: int = 32, object_store_mb: int = 512,
                 start_timeout_s: float = 90.0, env: Optional[dict] = None):
        self.num_cpus, self.start_timeout_s = num_cpus, start_timeout_s
        self.object_store_mb, self.n_worker_ports = object_store_mb, worker_ports
        self.env = dict(os.environ if env is None else env)
        self.env.pop("RAY_ADDRESS", None)
        # without this, Ray rewrites --node-ip-address 127.0.0.1 to the machine's address and listens everywhere
        self.env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        # Ray turns token authentication on when a token exists (~/.ray/auth_token); say so explicitly, so the
        # head and every client of it (client_env) agree: token when there is one, off otherwise
        self.token = auth_token(self.env)
        self.env["RAY_AUTH_MODE"] = "token" if self.token else "disabled"
        self.proc: Optional[subprocess.Popen] = None
        self.reaper: Optional[subprocess.Popen] = None
        self.temp_dir: Optional[str] = None
        self.ports: dict = {}
        self.start_seconds = 0.0

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.ports['--port']}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['--dashboard-port']}"

    def client_env(self, **extra) -> dict:
        """Environment for `ray job submit` / `ray status` against this head (auth mode set to match it)."""
        return {**self.env, **extra}

    def job_client(self):
        """Ray's JobSubmissionClient for this head's dashboard (sends the auth token when there is one)."""
        from ray.job_submission import JobSubmissionClient

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        return JobSubmissionClient(self.dashboard_url, headers=headers)

    def start(self) -> "RayHead":
        # short path: Ray's unix sockets live under the temp dir and must stay under 108 characters
        self.temp_dir = tempfile.mkdtemp(prefix="rayhead-", dir="/tmp")
        ports = free_ports(len(PORT_FLAGS) + self.n_worker_ports)
        self.ports = dict(zip(PORT_FLAGS, ports))
        workers = ports[len(PORT_FLAGS):]
        cmd = [RAY, "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.num_cpus),
               "--num-gpus", "0", "--temp-dir", self.temp_dir, "--include-dashboard", "true",
               "--dashboard-host", "127.0.0.1", "--object-store-memory", str(self.object_store_mb * 2**20),
               "--worker-port-list", ",".join(map(str, workers)), "--disable-usage-stats"]
        for flag, port in self.ports.items():
            cmd += [flag, str(port)]
        self.log_path = Path(self.temp_dir) / "ray_start.log"
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        # its own session: a Ctrl-C to the test's process group leaves it to watch for the test's exit
        self.reaper = subprocess.Popen([sys.executable, __file__, str(os.getpid()), str(self.proc.pid), self.temp_dir,
                                        self.gcs_address], start_new_session=True, stdin=subprocess.DEVNULL)
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _wait_ready(self, t0: float) -> None:
        """Bounded wait until the dashboard's job API answers and the head's node is alive."""
        deadline, last = t0 + self.start_timeout_s, "no answer yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`ray start --head` exited with {self.proc.returncode} before the cluster was "
                                   f"ready:\n{self.log_tail()}")
            try:       # Ray's own client: it sends the cluster's auth token (~/.ray/auth_token) when one is set
                self.job_client().list_jobs()      # the job API answers: `ray job submit` can go ...
                if self.alive_nodes() >= 1:        # ... and the head's raylet has registered: drivers can join
                    return
                last = "the job API answers, but no node is alive yet"
            except Exception as e:  # noqa: BLE001 - connection refused, 5xx while the dashboard starts, ...
                last = repr(e)[:300]
            time.sleep(0.5)
        raise TimeoutError(f"Ray head (GCS {self.gcs_address}, dashboard {self.dashboard_url}) not ready within "
                           f"{self.start_timeout_s:g}s (last: {last}):\n{self.log_tail()}")

    def alive_nodes(self) -> int:
        """Nodes in state ALIVE, from the dashboard's state API (the job API answers before the raylet has
        registered, and a driver joining then may time out waiting for it)."""
        import json
        import urllib.request

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        req = urllib.request.Request(self.dashboard_url + "/api/v0/nodes", headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            nodes = json.loads(r.read())["data"]["result"]["result"]
        return sum(1 for n in nodes if n.get("state") == "ALIVE")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no ray start log)"

    def pids(self) -> list[int]:
        """Processes of this cluster still alive: the ``ray start`` session plus every process naming its temp
        dir or its GCS address on the command line (not the reaper)."""
        pids = cluster_pids(self.proc.pid if self.proc is not None else None,
                            [self.temp_dir, self.gcs_address if self.ports else None])
        return [p for p in pids if self.reaper is None or p != self.reaper.pid]

    def stop(self, grace_s: float = 10.0) -> None:
        """End exactly this cluster (SIGTERM, then SIGKILL after ``grace_s``) and remove its temp dir."""
        if self.proc is None and self.temp_dir is None:
            return
        if self.reaper is not None:      # this process stops the cluster itself
            self.reaper.kill()
            self.reaper.wait(timeout=10)
            self.reaper = None
        end_processes(self.pids, grace_s, poll=self.proc.poll if self.proc is not None else None)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        left = self.pids()
        self.proc = None
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        if left:
            raise RuntimeError(f"Ray head processes still alive after SIGKILL: {left}")

    def __enter__(self) -> "RayHead":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":     # the reaper: python ray_head.py PARENT_PID SID TEMP_DIR GCS_ADDRESS
    reap_when_orphaned(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])

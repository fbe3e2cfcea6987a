"""Launch `slick serve` workers and the real sglang-router in front of them.

    workers = launch_workers(model_dir, 2)                 # subprocesses on free loopback ports
    with launch_router([w.url for w in workers]) as router:
        HttpEngine([router.url], control_urls=[w.url for w in workers])
        router.add_worker(url); router.remove_worker(url); router.list_workers()
    for w in workers: w.stop()

The router is the Rust binary from the PyPI package ``sglang-router`` (extra ``slick[router]``),
started as ``python -m sglang_router.launch_router``. Worker management uses its REST API
(0.3.x): ``GET /workers``, ``POST /workers {"url"}``, ``DELETE /workers/{worker_id}``.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Optional

from slick.engines.launch_ready import ServerStartError, wait_ready
from slick.proc.children import die_with_parent, watch_parent_args


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _http(method: str, url: str, payload: Optional[dict] = None, timeout: float = 5.0):
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read().decode()
    try:
        return json.loads(body) if body.strip() else None
    except ValueError:
        return body


def _healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        _http("GET", url + "/health", timeout=timeout)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


class _Process:
    """A child process with a log file and a URL; stop() sends SIGTERM, then SIGKILL."""

    name = "process"

    def __init__(self, cmd: list[str], url: str, log_path: str, env: Optional[dict] = None):
        cmd = self.watched(list(cmd))
        self.cmd, self.url, self.log_path = cmd, url, log_path
        self._log = open(log_path, "wb")
        # its own session (a Ctrl-C in the terminal reaches the driver only, which stops it), but never an
        # orphan: the kernel signals it when the driver dies, and the child watches its parent (slick.proc)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))

    def watched(self, cmd: list[str]) -> list[str]:
        """``cmd`` with the watch of this process's pid that makes the child exit when the driver dies."""
        return cmd

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> None:
        """Ready when the launched process (or a child of it) owns the port and GET /health answers 200
        (``slick.engines.launch_ready``); else stop it and raise ServerStartError (a RuntimeError) naming the port's
        squatter, the exit code or the timeout, with the last lines of its log."""
        try:
            wait_ready(self.proc, self.url, name=self.name, log_path=self.log_path, timeout=timeout,
                       healthy=lambda: _healthy(self.url))
        except ServerStartError:
            self.stop()
            raise

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. Returns the exit code."""
        if self.alive():
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (simulates a crashed worker)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r}, pid={self.pid}, alive={self.alive()})"


class WorkerProcess(_Process):
    """One ``slick serve`` subprocess."""

    name = "slick serve worker"

    def watched(self, cmd: list[str]) -> list[str]:
        if "serve" in cmd and "--parent-pid" not in cmd:
            cmd = [*cmd, "--parent-pid", str(os.getpid())]
        return cmd


class RouterProcess(_Process):
    """The sglang-router subprocess plus helpers for its worker-management API."""

    name = "sglang-router"

    def watched(self, cmd: list[str]) -> list[str]:
        module = "sglang_router.launch_router"
        return watch_parent_args(cmd, module) if cmd[1:3] == ["-m", module] else cmd

    def __init__(self, cmd, url, log_path, metrics_url: str, env=None):
        super().__init__(cmd, url, log_path, env)
        self.metrics_url = metrics_url

    def workers(self) -> list[dict]:
        """The router's worker records (``id``, ``url``, ``is_healthy``, ...)."""
        out = _http("GET", self.url + "/workers")
        return list(out.get("workers", [])) if isinstance(out, dict) else list(out or [])

    def list_workers(self) -> list[str]:
        """URLs of the workers the router currently routes to."""
        return [w["url"] for w in self.workers()]

    def add_worker(self, url: str, timeout: float = 60.0) -> None:
        """Register a worker (``POST /workers``) and wait until the router lists it."""
        url = url.rstrip("/")
        _http("POST", self.url + "/workers", {"url": url}, timeout=timeout)
        self._wait_for(lambda urls: url in urls, f"add {url}", timeout)

    def remove_worker(self, url: str, timeout: float = 60.0) -> None:
        """Unregister a worker (``DELETE /workers/{id}``) and wait until the router drops it."""
        url = url.rstrip("/")
        ids = [w["id"] for w in self.workers() if w.get("url", "").rstrip("/") == url]
        if not ids:
            raise KeyError(f"router {self.url} has no worker {url}; it has {self.list_workers()}")
        for wid in ids:
            _http("DELETE", f"{self.url}/workers/{wid}", timeout=timeout)
        self._wait_for(lambda urls: url not in urls, f"remove {url}", timeout)

    def _wait_for(self, cond, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond(self.list_workers()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"router {self.url}: could not {what} within {timeout:.0f}s "
                           f"(workers now {self.list_workers()}); log {self.log_path}")


def _log_path(prefix: str, log_dir: Optional[str]) -> str:
    d = log_dir or os.path.join(tempfile.gettempdir(), "slick-logs")
    os.makedirs(d, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".log", dir=d)
    os.close(fd)
    return path


def launch_workers(hf_checkpoint: str, n: int, *, dtype: str = "auto", host: str = "127.0.0.1",
                   base_port: Optional[int] = None, api_key: Optional[str] = None, max_running: Optional[int] = None,
                   extra_args: Optional[list[str]] = None, startup_timeout: float = 300.0,
                   log_dir: Optional[str] = None, threads: Optional[int] = None) -> list[WorkerProcess]:
    """Start ``n`` ``slick serve`` subprocesses (in parallel) and wait until each answers /health.

    Each worker gets ``OMP_NUM_THREADS = threads or cores // n`` unless the caller's environment sets it
    (``threads``: a replacement for one of several workers gets the share the first ones got).
    ``max_running``: each worker's ``--max-running`` (None: `slick serve`'s default, or the
    ``--sglang-max-running-requests`` of ``extra_args``). Ports are ``base_port + i`` when given, else free ports
    picked by the OS. On any failure every
    started worker is stopped and a RuntimeError carrying the worker's log tail is raised.
    """
    if n < 1:
        raise ValueError(f"launch_workers needs n >= 1, got {n}")
    workers: list[WorkerProcess] = []
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # split the cores between the workers: oversubscribed OpenMP teams (n x all cores) spin against each
    # other and a CPU worker slows down by an order of magnitude
    env.setdefault("OMP_NUM_THREADS", str(threads or max(1, (os.cpu_count() or 1) // n)))
    try:
        for i in range(n):
            port = base_port + i if base_port else free_port(host)
            cmd = [sys.executable, "-m", "slick.cli", "serve", "--hf-checkpoint", str(hf_checkpoint),
                   "--host", host, "--port", str(port), "--dtype", dtype]
            if max_running is not None:
                cmd += ["--max-running", str(max_running)]
            if api_key:
                cmd += ["--api-key", api_key]
            cmd += list(extra_args or [])
            workers.append(WorkerProcess(cmd, f"http://{host}:{port}", _log_path(f"worker{i}-", log_dir), env))
        for w in workers:
            w.wait_ready(startup_timeout)
    except BaseException:
        for w in workers:
            w.stop(timeout=5)
        raise
    return workers


def router_available() -> bool:
    """True when the sglang-router package (and its binary) can be imported."""
    try:
        import sglang_router  # noqa: F401
        return True
    except ImportError:
        return False


def launch_router(worker_urls: list[str], *, host: str = "127.0.0.1", port: Optional[int] = None,
                  prometheus_port: Optional[int] = None, policy: str = "round_robin",
                  startup_timeout: float = 120.0, extra_args: Optional[list[str]] = None,
                  log_dir: Optional[str] = None) -> RouterProcess:
    """Start the real sglang-router in front of ``worker_urls`` and wait until it routes to all of them.

    The Prometheus port is always set (a free one by default) so parallel routers do not collide.
    """
    if not router_available():
        raise RuntimeError("sglang-router is not installed; install the extra: pip install 'slick[router]' "
                           "(sglang-router==0.3.2)")
    port = port or free_port(host)
    prometheus_port = prometheus_port or free_port(host)
    urls = [u.rstrip("/") for u in worker_urls]
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--policy", policy, "--prometheus-host", host, "--prometheus-port", str(prometheus_port),
           "--log-level", "warn"]
    if urls:
        cmd += ["--worker-urls", *urls]
    cmd += list(extra_args or [])
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    r = RouterProcess(cmd, f"http://{host}:{port}", _log_path("router-", log_dir),
                      f"http://{host}:{prometheus_port}/metrics", env)
    try:
        r.wait_ready(startup_timeout)
        r._wait_for(lambda listed: all(u in listed for u in urls), "register the workers", startup_timeout)
    except BaseException:
        r.stop(timeout=5)
        raise
    return r

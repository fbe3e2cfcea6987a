"""When a server slick launched is ready: it answers its health route AND it is the process slick started.

A port picked free a moment ago can be taken by another process before the server binds it (or the server may
fail to bind and exit while something else answers there). Trusting whoever answers ``/health`` on the port would
send the run's API key, prompts and weights to that process. So a launched server is ready only when

1. the launched process, or one of its descendants (vLLM's API server, the router's binary), owns the socket
   listening on the port: the listening sockets of ``/proc/net/tcp`` and ``/proc/net/tcp6`` matched by inode
   against the ``socket:[INODE]`` links of ``/proc/PID/fd`` of the launched process tree (Linux; where ``/proc``
   has no ``net/tcp``, e.g. macOS, the ownership check is skipped and said so once in the log), and
2. its health route answers 200.

Failures name what happened: "port P already in use by pid X (its command line)" when another process listens
there (the launch stops at once: the server cannot bind it), "exited with code N before it was ready" with the
last lines of the server's log, or "not ready after T s" with the same lines. :class:`ServerStartError` carries the
message; :func:`wait_ready` works for any launched server (``slick serve`` workers, vLLM, SGLang, the router).
"""
from __future__ import annotations

import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger("slick.engine")
PROC = Path("/proc")
LISTEN = "0A"          # TCP state LISTEN in /proc/net/tcp
TAIL_LINES = 20
_warned = False


class ServerStartError(RuntimeError):
    """A launched server did not become ready as the process slick started (message: what happened, log tail)."""


def listening_inodes(port: int, proc: Path = PROC) -> Optional[set]:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6); None where ``/proc/net/tcp`` does not exist."""
    tables = [proc / "net" / "tcp", proc / "net" / "tcp6"]
    if not tables[0].is_file():
        return None
    out = set()
    for t in tables:
        try:
            lines = t.read_text().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            if len(f) > 9 and f[3] == LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(int(f[9]))
    return out


def socket_inodes(pid: int, proc: Path = PROC) -> set:
    """Inodes of the sockets process ``pid`` holds open (those its fds we may read)."""
    out = set()
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def _parents(proc: Path = PROC) -> dict:
    """pid -> parent pid of every process we can see."""
    out = {}
    for d in proc.iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                out[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return out


def process_tree(pid: int, proc: Path = PROC) -> set:
    """``pid`` and all its descendants."""
    children: dict = {}
    for p, parent in _parents(proc).items():
        children.setdefault(parent, []).append(p)
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo += children.get(p, [])
    return tree


def describe_pid(pid: int, proc: Path = PROC) -> str:
    try:
        cmd = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:160]})" if cmd else f"pid {pid}"


def port_owner(port: int, pid: int, proc: Path = PROC) -> tuple[str, str]:
    """``("none" | "ours" | "other" | "unknown", detail)``: who listens on ``port`` with respect to the process
    tree of ``pid`` ("unknown": this system has no ``/proc/net/tcp``)."""
    inodes = listening_inodes(port, proc)
    if inodes is None:
        return "unknown", "no /proc/net/tcp on this system"
    if not inodes:
        return "none", ""
    if any(inodes & socket_inodes(p, proc) for p in process_tree(pid, proc)):
        return "ours", ""
    owners = [p for p in _parents(proc) if inodes & socket_inodes(p, proc)]
    who = ", ".join(describe_pid(p, proc) for p in owners[:3]) or "a process this user cannot see (another user's)"
    return "other", who


def log_tail(log_path: Optional[str], lines: int = TAIL_LINES) -> str:
    """The last ``lines`` non-empty lines of a server log (``(no log)`` when there is none)."""
    if not log_path:
        return "(no log)"
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(log {log_path} unreadable: {e})"
    kept = [ln for ln in text.splitlines() if ln.strip()][-lines:]
    return "\n".join(kept) if kept else "(empty log)"


def health_ok(url: str, path: str = "/health", timeout: float = 2.0) -> bool:
    """Whether GET ``url + path`` answers 200."""
    try:
        with urllib.request.urlopen(url + path, timeout=timeout) as r:
            r.read(1 << 16)
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_ready(popen, url: str, *, name: str, log_path: Optional[str], timeout: float,
               healthy: Optional[Callable[[], bool]] = None, poll_s: float = 0.25) -> None:
    """Wait until the server ``popen`` (a ``subprocess.Popen``) serving ``url`` is ready (module doc); raise
    :class:`ServerStartError` naming the port's squatter, the exit code, or the timeout, with the log's last lines.
    ``healthy``: the health probe (default: GET ``url/health`` answers 200). The caller stops the process."""
    global _warned
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    healthy = healthy or (lambda: health_ok(url))
    deadline = time.monotonic() + timeout
    while True:
        code = popen.poll()
        if code is not None:
            owner, who = port_owner(port, popen.pid)
            held = f"; port {port} is in use by {who}" if owner == "other" else ""
            raise ServerStartError(f"{name} (pid {popen.pid}) exited with code {code} before it was ready{held}; "
                                   f"last lines of {log_path}:\n{log_tail(log_path)}")
        owner, who = port_owner(port, popen.pid)
        if owner == "other":
            raise ServerStartError(f"{name} (pid {popen.pid}) at {url}: port {port} already in use by {who}, not by "
                                   f"the launched server; it is not trusted with the run's requests. Last lines of "
                                   f"{log_path}:\n{log_tail(log_path)}")
        if owner == "unknown" and not _warned:
            _warned = True
            log.warning("%s: cannot check which process owns port %d (%s); trusting its health answer", name, port,
                        who)
        if owner in ("ours", "unknown") and healthy():
            return
        if time.monotonic() >= deadline:
            raise ServerStartError(f"{name} (pid {popen.pid}) at {url} not ready after {timeout:.0f}s; last lines "
                                   f"of {log_path}:\n{log_tail(log_path)}")
        time.sleep(poll_s)

"""A memory cgroup per sandboxed program, where this host lets slick make one.

RLIMIT_AS bounds each process; a memory cgroup bounds the program as a whole: every process of it, its
in-memory files (``/tmp``, ``/dev/shm``) and the kernel memory it makes the kernel hold (pipes, sockets) count
against one ``memory_mb`` budget, swap included; past it the kernel's OOM killer ends a process of that
program only. :func:`find` looks for a place to make such groups (cgroup v2 with the memory controller, or
the v1 ``memory`` hierarchy), proves it by making and removing one, and returns a :class:`CgroupParent`, or
None with the reason in :data:`LAST_REASON` (not root, a container without a writable cgroup tree, ...).

A program's group is named like its host directory (``slick-sandbox-<pid>-<start>-<random>``, see
:mod:`slick.reward.sandbox.owner`); the pool moves the sandbox's first process into it before that process
runs anything, and removes it after. Groups of a scorer that was SIGKILLed are removed by the next pool
that starts (:meth:`CgroupParent.sweep`).
"""
from __future__ import annotations

import os
import secrets
import signal
import time
from typing import Optional

from slick.reward.sandbox import owner

EMPTY_WAIT_S = 2.0
LAST_REASON = ""


def _read(path: str) -> str:
    with open(path, encoding="ascii") as fh:
        return fh.read()


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


def _mounts() -> list[tuple[str, str, set]]:
    """(mount point, file system type, super options) of each cgroup mount, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                found.append((fields[4].replace("\\040", " "), rest[0], set(rest[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """{controller list or "" for v2: this process's cgroup path}, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            paths[controllers] = path
    return paths


class CgroupParent:
    """Where programs' groups are made: ``path``, a cgroup directory; ``version`` 1 or 2."""

    def __init__(self, path: str, version: int):
        self.path, self.version = path, version

    def __repr__(self) -> str:
        return f"cgroup v{self.version} at {self.path}"

    def create(self, name: str, memory_mb: int) -> "ProgramCgroup":
        """A new group ``name`` whose memory (swap included) is at most ``memory_mb`` MiB."""
        group = ProgramCgroup(os.path.join(self.path, name), self.version)
        os.mkdir(group.path)
        try:
            group.limit(int(memory_mb) << 20)
        except OSError:
            group.remove()
            raise
        return group

    def sweep(self) -> list[str]:
        """Remove the groups of owners that are gone (a SIGKILLed scorer's); the names removed."""
        removed = []
        for name in owner.stale(os.listdir(self.path)):
            group = ProgramCgroup(os.path.join(self.path, name), self.version)
            if os.path.isdir(group.path) and group.remove():
                removed.append(name)
        return removed


class ProgramCgroup:
    """One program's memory cgroup."""

    def __init__(self, path: str, version: int):
        self.path, self.version = path, version

    def limit(self, nbytes: int) -> None:
        if self.version == 2:
            _write(os.path.join(self.path, "memory.max"), str(nbytes))
            if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                _write(os.path.join(self.path, "memory.swap.max"), "0")
        else:
            _write(os.path.join(self.path, "memory.limit_in_bytes"), str(nbytes))
            if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                _write(os.path.join(self.path, "memory.memsw.limit_in_bytes"), str(nbytes))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (and its future children) into the group."""
        _write(os.path.join(self.path, "cgroup.procs"), str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in _read(os.path.join(self.path, "cgroup.procs")).split()]
        except (OSError, ValueError):
            return []

    def oom_kills(self) -> int:
        """How many processes of the group the kernel's OOM killer ended (0 when the kernel does not say)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in _read(os.path.join(self.path, name)).splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def peak_bytes(self) -> Optional[int]:
        """The group's largest memory use so far, where the kernel keeps it."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        try:
            return int(_read(os.path.join(self.path, name)).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self) -> bool:
        """Kill what is left in the group, wait until it is empty, remove it; False when it stays."""
        deadline = time.monotonic() + EMPTY_WAIT_S
        while True:
            left = self.pids()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.02)


def _candidates() -> list[tuple[str, int]]:
    """Directories where a program's group could go, the most specific first."""
    out = []
    own = _own_paths()
    for point, fstype, opts in _mounts():
        if fstype == "cgroup2" and "" in own:
            here = os.path.normpath(point + own[""])
            if "memory" in _read_or_empty(os.path.join(point, "cgroup.controllers")).split():
                out += [(here, 2)] + ([(point, 2)] if here != point else [])
        elif fstype == "cgroup" and "memory" in opts:
            path = next((p for c, p in own.items() if "memory" in c.split(",")), None)
            if path is not None:
                out.append((os.path.normpath(point + path), 1))
    return out


def _read_or_empty(path: str) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def _usable(path: str, version: int) -> bool:
    """Enable the memory controller below ``path`` (v2), then make and remove a probe group."""
    if version == 2 and "memory" not in _read_or_empty(os.path.join(path, "cgroup.subtree_control")).split():
        _write(os.path.join(path, "cgroup.subtree_control"), "+memory")
    probe = CgroupParent(path, version).create(f"slick-sandbox-probe-{os.getpid()}-{secrets.token_hex(4)}", 64)
    return probe.remove()


def find() -> Optional[CgroupParent]:
    """Where programs' memory cgroups can be made on this host, or None (:data:`LAST_REASON` says why)."""
    global LAST_REASON
    reasons = []
    try:
        candidates = _candidates()
    except OSError as e:
        candidates, reasons = [], [f"cannot read this process's cgroups: {e}"]
    for path, version in candidates:
        try:
            if _usable(path, version):
                LAST_REASON = ""
                return CgroupParent(path, version)
            reasons.append(f"{path}: a probe group could not be removed")
        except OSError as e:
            reasons.append(f"{path}: {e.strerror or e}")
    LAST_REASON = "; ".join(reasons) or "no cgroup file system with the memory controller is mounted"
    return None

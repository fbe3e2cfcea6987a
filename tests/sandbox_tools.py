"""Shared by the sandbox tests: a pool when bubblewrap works here (skip otherwise, or fail with
SLICK_REQUIRE_BWRAP=1), and a census of what a sandboxed program may leave behind."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import psutil
import pytest

from slick.reward.sandbox import Limits, SandboxPool, SandboxUnavailable


def make_pool(workers: int = 2, **limits) -> SandboxPool:
    """A checked pool; skips the test when bwrap is missing or cannot start a sandbox here, unless
    SLICK_REQUIRE_BWRAP=1 (CI after `make sandbox`), which turns that into a failure."""
    try:
        pool = SandboxPool(workers, Limits(**limits))
        pool.check()
        return pool
    except SandboxUnavailable as e:
        if os.environ.get("SLICK_REQUIRE_BWRAP") == "1":
            pytest.fail(f"SLICK_REQUIRE_BWRAP=1 but the sandbox is unavailable: {e}")
        pytest.skip(f"sandbox unavailable: {e}")


def sandbox_processes() -> list[psutil.Process]:
    """Live processes of any sandbox: bwrap itself or a program (its command line names /sandbox/main.py)."""
    found = []
    for p in psutil.process_iter(["cmdline", "name", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if "/sandbox/main.py" in cmd or p.info["name"] == "bwrap":
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def sandbox_dirs() -> list[str]:
    """Program directories the pool has not removed."""
    tmp = tempfile.gettempdir()
    return sorted(n for n in os.listdir(tmp) if n.startswith("slick-sandbox-"))


class HostState:
    """Free memory and disk, sandbox processes and directories, before a program; :meth:`assert_back` after."""

    MEMORY_SLACK = 512 << 20      # other processes share this machine: a stated bound, not equality
    DISK_SLACK = 256 << 20

    def __init__(self):
        self.memory = psutil.virtual_memory().available
        self.disk = shutil.disk_usage(tempfile.gettempdir()).free
        self.dirs = sandbox_dirs()

    def assert_back(self) -> None:
        left = sandbox_processes()
        deadline = time.monotonic() + 3.0       # the kernel may still be tearing the PID namespace down
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = sandbox_processes()
        assert left == []
        assert sandbox_dirs() == self.dirs
        assert psutil.virtual_memory().available > self.memory - self.MEMORY_SLACK
        assert shutil.disk_usage(tempfile.gettempdir()).free > self.disk - self.DISK_SLACK

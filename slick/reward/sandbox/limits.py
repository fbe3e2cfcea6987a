"""What one sandboxed program may use: :class:`Limits`, set as rlimits inside the sandbox and enforced by the pool.

Every limit is a hard one: the program cannot raise it (``setrlimit`` back up, through ``resource`` or ``ctypes``,
fails with EPERM), and the wall-clock timeout and the output cap are enforced from outside.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional

from slick.config.groups import SandboxConfig

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-program limits (the ``--sandbox-*`` flags; ``docs/sandbox.md``).

    ``wall_seconds``: the whole sandbox is killed after this many seconds (verdict ``time_limit``);
    ``cpu_seconds``: RLIMIT_CPU of each process (SIGXCPU at the limit, SIGKILL one second later);
    ``memory_mb``: RLIMIT_AS (address space) of each process; ``max_processes``: RLIMIT_NPROC (processes and
    threads of the sandbox's user, counted in its own user namespace); ``file_size_mb``: RLIMIT_FSIZE (largest
    file it may write); ``open_files``: RLIMIT_NOFILE; ``output_kb``: stdout and stderr are each read up to
    this many KiB, past it the sandbox is killed (verdict ``output_limit``); ``tmp_mb``: size of the fresh
    in-memory ``/tmp`` (its working directory), freed when the program ends.
    """
    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 1024
    max_processes: int = 32
    file_size_mb: int = 16
    open_files: int = 64
    output_kb: int = 1024
    tmp_mb: int = 64

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"sandbox limit {f.name} must be a positive number, got {value!r}")

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """``{RLIMIT name: (soft, hard)}`` as the launcher sets them inside the sandbox."""
        cpu = max(1, int(round(self.cpu_seconds)))
        return {"RLIMIT_CPU": (cpu, cpu + 1), "RLIMIT_AS": (self.memory_mb * MIB,) * 2,
                "RLIMIT_NPROC": (int(self.max_processes),) * 2, "RLIMIT_FSIZE": (self.file_size_mb * MIB,) * 2,
                "RLIMIT_NOFILE": (int(self.open_files),) * 2, "RLIMIT_CORE": (0, 0)}

    @property
    def output_bytes(self) -> int:
        return int(self.output_kb * 1024)

    @classmethod
    def from_config(cls, cfg: SandboxConfig) -> "Limits":
        """The limits of the sandbox group (``slick.config.groups.SandboxConfig``: ``--sandbox-*``)."""
        return cls(wall_seconds=cfg.sandbox_timeout, cpu_seconds=cfg.sandbox_cpu_seconds,
                   memory_mb=cfg.sandbox_memory_mb, max_processes=cfg.sandbox_max_processes,
                   file_size_mb=cfg.sandbox_file_size_mb, open_files=cfg.sandbox_open_files,
                   output_kb=cfg.sandbox_output_kb, tmp_mb=cfg.sandbox_tmp_mb)


def default_workers(workers: Optional[int] = None) -> int:
    """``workers`` when given (>= 1), else the cores this process may run on."""
    if workers is not None:
        if int(workers) < 1:
            raise ValueError(f"--sandbox-workers must be >= 1, got {workers}")
        return int(workers)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)

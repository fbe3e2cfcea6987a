"""A local sandbox for untrusted programs (code rewards, tools): bubblewrap namespaces plus rlimits.

::

    from slick.reward import sandbox
    r = sandbox.run("print(input()[::-1])", stdin="abc\\n")          # the shared default pool
    r.verdict, r.stdout, r.stderr_tail, r.seconds                    # "ok", "cba\\n", "", 0.03
    sandbox.run(code, stdin, sandbox.Limits(wall_seconds=2, memory_mb=256))

:class:`SandboxPool` bounds how many programs run at once (``--sandbox-workers``); :func:`run` uses one
process-wide pool with default limits and one worker per core (:func:`configure` replaces it, e.g. from a
run's config). What the sandbox allows and forbids: :mod:`slick.reward.sandbox.command` and docs/sandbox.md.
"""
from __future__ import annotations

import threading
from typing import Optional

from slick.config.groups import SandboxConfig
from slick.reward.sandbox.command import SandboxUnavailable, find_bwrap
from slick.reward.sandbox.limits import Limits
from slick.reward.sandbox.pool import (KILLED, MEMORY_LIMIT, OK, OUTPUT_LIMIT, RUNTIME_ERROR, TIME_LIMIT, VERDICTS,
                                       Result, SandboxPool, Text)

__all__ = ["KILLED", "Limits", "MEMORY_LIMIT", "OK", "OUTPUT_LIMIT", "RUNTIME_ERROR", "Result", "SandboxPool",
           "SandboxUnavailable", "TIME_LIMIT", "VERDICTS", "configure", "default_pool", "find_bwrap",
           "pool_from_config", "run"]

_default: Optional[SandboxPool] = None
_lock = threading.Lock()


def pool_from_config(cfg: SandboxConfig) -> SandboxPool:
    """A pool with the ``--sandbox-*`` settings: the sandbox group (``slick.config.groups.SandboxConfig``)."""
    return SandboxPool(cfg.sandbox_workers, Limits.from_config(cfg), python=cfg.sandbox_python)


def configure(pool: SandboxPool) -> SandboxPool:
    """Make ``pool`` the one :func:`run` (and ``@tool(sandbox=True)``) use; returns it."""
    global _default
    with _lock:
        _default = pool
    return pool


def default_pool() -> SandboxPool:
    """The process-wide pool (created on first use: default limits, one worker per core)."""
    global _default
    with _lock:
        if _default is None:
            _default = SandboxPool()
        return _default


def run(code: str, stdin: Text = "", limits: Optional[Limits] = None) -> Result:
    """Run Python ``code`` with ``stdin`` in a fresh sandbox of the default pool (blocks); a :class:`Result`."""
    return default_pool().run(code, stdin, limits)

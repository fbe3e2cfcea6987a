"""Which process owns a sandbox's host-side leftovers, so that the next pool can remove a dead owner's.

A program's host directory (``$TMPDIR/slick-sandbox-<pid>-<start>-<random>``) and its memory cgroup carry the
pid of the process that made them and that process's start time (clock ticks since boot, from
``/proc/<pid>/stat``). The owner removes them when the program ends; if it was SIGKILLed first, a pool that
starts later (:func:`sweep_dirs`, at construction) removes every one whose owner is gone: no process with that
pid, or one that started at another time (the pid was reused).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Iterable, Optional

PREFIX = "slick-sandbox-"
_NAME = re.compile(r"^slick-sandbox-(\d+)-(\d+)-")


def start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks after boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    try:
        return int(text[text.rindex(")") + 2:].split()[19])      # field 22; the name may hold spaces
    except (ValueError, IndexError):
        return None


def prefix() -> str:
    """The name prefix of this process's leftovers: ``slick-sandbox-<pid>-<start>-``."""
    pid = os.getpid()
    return f"{PREFIX}{pid}-{start_ticks(pid) or 0}-"


def stale(names: Iterable[str]) -> list[str]:
    """The names among ``names`` whose owner is gone."""
    out = []
    for name in names:
        m = _NAME.match(name)
        if m and start_ticks(int(m.group(1))) != int(m.group(2)):
            out.append(name)
    return out


def sweep_dirs(root: Optional[str] = None) -> list[str]:
    """Remove dead owners' program directories under ``root`` (default: the temp dir); their names."""
    root = root or tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in stale(names):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(name)
    return removed

"""Which directories ``/update_weights_from_disk`` may load: the served model, slick's own weight syncs, and
the directories the user allowed.

A ``model_path`` is resolved (symlinks followed) and accepted when it is

1. the served ``--hf-checkpoint`` directory or a directory under it (reloading the model being served);
2. under a directory given with ``--allowed-weight-dirs`` (comma-separated; each one and everything below it);
3. a directory written by slick's disk weight transport (``slick.weights.transport.disk``): it holds the
   transport's version marker ``slick_weights.json``, and the directory and the marker belong to the user this
   server runs as and are writable by no other user (no "other" write bit), so no other account can have
   planted them.

Anything else is refused with 403 naming the path, before the path is opened or even checked for existence.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Iterable, Optional

MARKER = "slick_weights.json"       # the disk transport's version marker (slick.weights.transport.disk.MARKER)


def parse_dirs(value: Optional[str]) -> list[str]:
    """``"/a, /b"`` -> ``["/a", "/b"]`` (the --allowed-weight-dirs flag)."""
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def _real(path) -> Path:
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _own_and_private(path: Path) -> bool:
    """Owned by this process's user and not writable by others (lstat: the entry itself, no symlink)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & stat.S_IWOTH and not stat.S_ISLNK(st.st_mode)


class WeightDirPolicy:
    """``check(path)`` returns None when ``path`` may be loaded, else the reason (module doc)."""

    def __init__(self, served: Optional[str] = None, allowed: Iterable[str] = ()):
        self.served = _real(served) if served else None
        self.allowed = [_real(d) for d in allowed]

    def written_by_slick(self, path: Path) -> bool:
        marker = path / MARKER
        return path.is_dir() and _own_and_private(path) and _own_and_private(marker) and \
            stat.S_ISREG(os.lstat(marker).st_mode)

    def check(self, path: str) -> Optional[str]:
        real = _real(path)
        if self.served is not None and _under(real, self.served):
            return None
        if any(_under(real, root) for root in self.allowed):
            return None
        if self.written_by_slick(real):
            return None
        roots = ([str(self.served)] if self.served else []) + [str(d) for d in self.allowed]
        return (f"model_path {path!r} is not a directory this server may load weights from: it is neither the "
                f"served model{' or under ' + ', '.join(roots) if roots else ''}, nor a weight sync written by "
                f"slick (with {MARKER}, owned by this user); start slick serve with --allowed-weight-dirs "
                f"DIR to allow it")

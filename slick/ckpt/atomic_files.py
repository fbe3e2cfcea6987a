"""Durable small writes shared by checkpoints (slick.ckpt.checkpoint) and sharded checkpoints (slick.ckpt.dcp):
a file written whole or not at all, and its directory entry flushed."""
from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush ``path``'s directory entries to disk (best effort: a file system that cannot is left alone)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:           # a failed write leaves no temp file behind
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)

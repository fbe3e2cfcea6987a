"""Keep freed memory in the process on CPU: large tensors are then reused instead of re-faulted from the OS.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns it
on free. A training step allocates and frees tensors of that size many times (the lm head's logits chunks,
its weight gradient, autocast's casts), and each fresh mapping costs a page fault per 4 KiB: converting one
113 MB SmolLM2 embedding-sized tensor took ~80 ms instead of ~8 ms, and a demo-shaped step spent about 3 s of
15 in such faults. :func:`keep_freed_memory` makes glibc allocate from its heap and not give freed memory
back (``mallopt(M_MMAP_MAX, 0)`` and a high ``M_TRIM_THRESHOLD``): the process's RSS stays near its peak
instead of dropping between steps, which is what the peak-RSS numbers measure anyway.

``SLICK_KEEP_FREED_MEMORY=0`` leaves the allocator alone. Non-glibc systems are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_done = False


def keep_freed_memory() -> bool:
    """Apply the setting once per process; True when it is in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("SLICK_KEEP_FREED_MEMORY", "1").lower() in ("0", "false", "no", "off"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    if not _done:
        log.info("mallopt refused; the allocator returns freed memory to the OS as usual")
    return _done

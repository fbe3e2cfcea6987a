"""Keep freed memory in the process on CPU: large tensors are then reused instead of re-faulted from the OS.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and returns it
on free. A training step allocates and frees tensors of that size many times (the lm head's logits chunks,
its weight gradient, autocast's casts), and each fresh mapping costs a page fault per 4 KiB: converting one
113 MB SmolLM2 embedding-sized tensor took ~80 ms instead of ~8 ms, and a demo-shaped step spent about 3 s of
15 in such faults. :func:`keep_freed_memory` makes glibc allocate from its heap and not give freed memory
back (``mallopt(M_MMAP_MAX, 0)`` and a high ``M_TRIM_THRESHOLD``): the process's RSS stays near its peak
instead of dropping between steps, which is what the peak-RSS numbers measure anyway.

It also limits glibc to its main arena (``mallopt(M_ARENA_MAX, 1)``). A thread other than the main one
allocates from an arena of its own, made of 64 MiB heaps that glibc unmaps as soon as they are free, whatever
the settings above; the drivers train on such a thread, and there a demo-shaped step took ~475,000 page faults
instead of ~68,000 and ran 1.3-1.6x slower than the same step on the main thread. The limit only governs
threads that have not allocated yet, so the drivers apply it first thing (``Run``), before the tokenizer,
Ray or torch start theirs; the Trainer applies it too (for scripts that build one directly).

And it asks torch for transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``, unless set): tensors of 2 MiB and
more are then 2 MiB-aligned and advised ``MADV_HUGEPAGE``, so memory first touched costs one fault per 2 MiB
instead of per 4 KiB. Without it, ``M_MMAP_MAX=0`` also fragments the heap: torch allocates with
``posix_memalign``, whose padding keeps a freed block from fitting the next request of the same size, and a
loop of 48 MiB allocations grew RSS by 48 MiB per iteration; with huge pages the same loop reuses its block.
So where the user set ``THP_MEM_ALLOC_ENABLE`` to anything but 1, only the arena limit is applied. torch reads the variable at its first allocation of 2 MiB or more, so it must be set before that (the
drivers' first line is). The demo's train steps: 4.65 s with the allocator settings alone, 4.71 s with huge
pages too, 6.14 s with neither; peak RSS 6.0, 5.5 and 5.6 GB; page faults of the whole run 1.5 M, 0.67 M, 6.4 M.

``SLICK_KEEP_FREED_MEMORY=0`` leaves the allocator alone. Non-glibc systems are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
_done = False


def keep_freed_memory() -> bool:
    """Apply the setting once per process; True when it is in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("SLICK_KEEP_FREED_MEMORY", "1").lower() in ("0", "false", "no", "off"):
        return False
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = [(_M_ARENA_MAX, 1)]
    if os.environ["THP_MEM_ALLOC_ENABLE"] == "1":   # without huge pages, keeping memory fragments the heap
        settings += [(_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)]
    _done = all(mallopt(opt, value) for opt, value in settings)
    if not _done:
        log.info("mallopt refused; the allocator returns freed memory to the OS as usual")
    return _done

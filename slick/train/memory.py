"""CPU allocator settings for a training process: large tensors stop costing a page fault per 4 KiB.

A training step allocates and frees tensors of tens of MiB many times (the lm head's logits chunks, its
weight gradient, autocast's casts). glibc maps each of them fresh and unmaps it on free, and first touching
fresh memory costs a page fault per 4 KiB page. :func:`tune_cpu_allocator` changes two things:

* **One malloc arena** (``mallopt(M_ARENA_MAX, 1)``). A thread other than the main one otherwise allocates
  from an arena of its own, made of 64 MiB heaps that glibc unmaps as soon as they are empty, so even
  medium tensors are faulted in again on every step. The drivers train on such a thread: a demo-shaped step
  there took ~475,000 page faults instead of ~68,000 on the main thread, and ran 1.3-1.6x slower. The limit
  only governs threads that have not allocated yet, so the drivers apply it first thing (``Run``), before
  the tokenizer, Ray or torch start theirs; the Trainer applies it too (for scripts that build one).
* **Huge pages for torch's large tensors** (``THP_MEM_ALLOC_ENABLE=1``, unless the variable is set): torch
  then advises ``MADV_HUGEPAGE`` on every allocation of 2 MiB and more, and fresh memory costs one fault
  per 2 MiB. torch reads the variable at its first allocation of that size, so it must be set before.

Freed memory is still given back to the OS. Keeping it instead (``M_MMAP_MAX=0``, the previous setting)
gained 4-8% in single runs once huge pages were on (inside run-to-run noise), and fragments the heap: torch
allocates with ``posix_memalign``, whose padding keeps a freed block from fitting the next request of the
same size, so a loop of 48 MiB tensors could grow RSS by 48 MiB per iteration.

Demo train steps inside ``slick train`` (mean of steps 3-8, 2-core EPYC): 6.14 s with the one arena alone,
4.92 s with huge pages too, 5.69 s with huge pages but one arena per thread; page faults of the whole run
6.4 M, 1.2 M, 1.6 M.

:func:`release_free_memory` (``malloc_trim``) is for after one-time work: the drivers call it once the run is
built, so that what loading the models freed leaves the resident set.

``SLICK_TUNE_ALLOCATOR=0`` leaves the allocator alone. Non-glibc systems are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8
_done = False


def tune_cpu_allocator() -> bool:
    """Apply the settings once per process; True when they are in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("SLICK_TUNE_ALLOCATOR", "1").lower() in ("0", "false", "no", "off"):
        return False
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(_M_ARENA_MAX, 1))
    if not _done:
        log.info("mallopt(M_ARENA_MAX) refused; each thread keeps its own malloc arena")
    return _done


def release_free_memory() -> bool:
    """Give the pages of freed heap memory back to the OS (glibc ``malloc_trim``); True when it did.

    For after one-time work that frees a lot (loading models, building engines): that memory would otherwise
    stay in the process' resident set until reused."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))

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

**tcmalloc** (the better choice where installed: Debian's ``libtcmalloc-minimal4``, ``make tcmalloc``). The
slick entry points (the ``slick`` command, ``python -m slick.demo``, the benches) call :func:`use_tcmalloc`
first thing: when ``SLICK_ALLOCATOR`` is ``auto`` (the default) or ``tcmalloc`` and the library is found, the
process replaces itself (``execve``: same pid, same command line) with tcmalloc in ``LD_PRELOAD``, which every
process it starts inherits (engine servers, a local Ray cluster and its workers). tcmalloc keeps freed pages
for reuse in size-classed spans, so a step neither faults its memory in again nor strands it between
differently sized blocks, the two costs glibc has here. On ``bench/vs_trl.py``'s slick side (2-core EPYC,
6 steps each, one after another): train forward+backward of the later steps 3.1-3.7 s vs 4.6-5.1 s, kernel
time 8.5-10 s vs 18-23 s, peak RSS 3.90 GB vs 4.37-4.97 GB. jemalloc, tried the same way, held 4.0 GB but ran
slower than glibc (its decay returns pages the next step faults in again). Under tcmalloc the glibc settings
above are not applied (with torch's huge-page advice the same run measured no faster).
``SLICK_ALLOCATOR=glibc`` keeps glibc; ``tcmalloc`` makes a missing library an error.

**oneDNN's primitive cache** (:func:`limit_onednn_cache`): torch's CPU matmuls build one oneDNN primitive,
with its generated kernels, per shape, and keep the last ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` of them (oneDNN's
default: 1,024). A training micro-batch's token count, and so its matmul shapes, is new almost every step: the
cache grows through a whole run and holds kernels no later step reuses. The slick entry points set the
capacity to 128 unless the variable is set; a step's own shapes (a few dozen) still hit the cache.
``bench/memory_timeline.py``, vs_trl's task, 30 steps, one invocation: peak RSS 3,891 MiB at 1,024 entries,
3,646 at 128, at the same speed; 256 measured the same as 128 (``bench/results/memory_timeline.md``).

**Weights in the process's own memory** (:func:`own_memory`): Hugging Face loads a safetensors file whose dtype
is the one asked for as views of the file's memory map (private, copy-on-write). The first optimizer step then
writes every page of it, one copy-on-write fault per 4 KiB page: 1.57 s for SmolLM2-135M's fp32 weights on a
2-core AMX Xeon, against 0.11 s to copy them into fresh memory first (the trainer does, for the weights it
trains on a CPU).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

from slick.proc.children import ONEDNN_CACHE_ENTRIES, ONEDNN_CACHE_ENV, ONEDNN_CACHE_MARK

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8
_done = False
ALLOCATORS = ("auto", "tcmalloc", "glibc")
_TRIED = "SLICK_TCMALLOC_PRELOADED"   # set across the exec, so that a preload that failed is not retried


class AllocatorError(RuntimeError):
    pass


def tcmalloc_loaded() -> bool:
    """True when tcmalloc serves this process' mallocs (it is preloaded or linked in)."""
    try:
        with open("/proc/self/maps") as f:
            return "libtcmalloc" in f.read()
    except OSError:
        return False


def find_tcmalloc() -> str | None:
    """The name the dynamic linker knows tcmalloc by (``libtcmalloc_minimal.so.4``), or None."""
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def use_tcmalloc() -> None:
    """Re-execute this process (its exact command line, ``sys.orig_argv``) with tcmalloc preloaded, when
    ``SLICK_ALLOCATOR`` asks for it (``auto``: if installed) and it is not in use yet. Returns only when nothing
    is to be done. Raises :class:`AllocatorError` for an unknown ``SLICK_ALLOCATOR``, or ``tcmalloc`` that is
    not installed or did not load. Call it before the process does anything it should not do twice."""
    choice = os.environ.get("SLICK_ALLOCATOR", "auto").strip().lower() or "auto"
    if choice not in ALLOCATORS:
        raise AllocatorError(f"SLICK_ALLOCATOR={choice!r}: expected one of {', '.join(ALLOCATORS)}")
    if choice == "glibc" or tcmalloc_loaded():
        return
    lib = find_tcmalloc()
    if os.environ.get(_TRIED) == "1" or lib is None:
        if choice == "tcmalloc":
            why = (f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')!r} did not load it" if lib
                   else "no libtcmalloc_minimal or libtcmalloc is installed (Debian/Ubuntu: make tcmalloc)")
            raise AllocatorError(f"SLICK_ALLOCATOR=tcmalloc: {why}")
        return
    preload = " ".join(x for x in (lib, os.environ.get("LD_PRELOAD", "")) if x)
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**os.environ, "LD_PRELOAD": preload, _TRIED: "1"}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def limit_onednn_cache() -> str:
    """Set ONEDNN_PRIMITIVE_CACHE_CAPACITY to ONEDNN_CACHE_ENTRIES unless it is set; the value in effect. oneDNN
    reads it when it builds its first primitive, so call it before any torch work (the entry points do). The
    processes slick starts inherit it, except vLLM and SGLang servers (``slick.proc.children.foreign_engine_env``)."""
    if ONEDNN_CACHE_ENV not in os.environ:
        os.environ[ONEDNN_CACHE_ENV] = os.environ[ONEDNN_CACHE_MARK] = str(ONEDNN_CACHE_ENTRIES)
    return os.environ[ONEDNN_CACHE_ENV]


def tune_cpu_allocator() -> bool:
    """Apply the settings once per process; True when they are in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("SLICK_TUNE_ALLOCATOR", "1").lower() in ("0", "false", "no", "off") or tcmalloc_loaded():
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
    stay in the process' resident set until reused. Under tcmalloc: ``MallocExtension_ReleaseFreeMemory``."""
    if tcmalloc_loaded():
        release = getattr(ctypes.CDLL(None), "MallocExtension_ReleaseFreeMemory", None)
        if release is not None:
            release()
        return release is not None
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def own_memory(params) -> int:
    """Give every tensor of ``params`` whose storage the process did not allocate (a view of a file's memory map:
    not resizable) a fresh copy of its own, in place (``.data``: the same Parameter objects, ties kept).
    Returns the bytes copied."""
    copied = 0
    for p in params:
        if p.device.type == "cpu" and not p.untyped_storage().resizable():
            p.data = p.data.clone()
            copied += p.numel() * p.element_size()
    return copied

"""OpenMP worker threads of CPU phases that take turns (``slick train`` on a CPU).

torch gives every thread that runs a parallel kernel an OpenMP team of its own: ``slick train`` generates
on the event-loop thread (the in-process engine) and trains on the training thread, so the process holds two
teams. libgomp counts every worker it manages, and once there are more than CPUs it shortens the spin-wait of
every team to 100 iterations: each parallel region then wakes its workers through the kernel. On a 2-core
machine with both teams alive, the demo's train step took 3.6-4.6 s instead of 2.7-3.1 s, and decoding pays
the same (the engine's module doc measured it).

:func:`release_openmp_workers` ends the calling thread's workers (``omp_pause_resource_all``, which in
libgomp frees only the calling thread's pool); the next parallel region starts them again (microseconds).
A thread calls it when its phase ends, so that only the phase running now has a team: in ``slick train``, and in
``slick train-async`` when the trainer takes every core while the engine waits (``ThreadPolicy.releases_workers``,
``slick.loop.threads``; with thread flags the phases split the cores and never call it). Only
libgomp (torch's Linux CPU builds) is handled; elsewhere this does nothing.
"""
from __future__ import annotations

import ctypes
import logging
from typing import Optional

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1
_lib: Optional[ctypes.CDLL] = None


def _libgomp() -> Optional[ctypes.CDLL]:
    """The libgomp this process has loaded (torch's), or None (looked for again next time: torch may load it
    later)."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        with open("/proc/self/maps") as f:
            path = next((line.split()[-1] for line in f if line.rstrip().split("/")[-1].startswith("libgomp")),
                        None)
    except OSError:
        return None
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)   # already loaded: the same handle
        lib.omp_pause_resource_all.argtypes, lib.omp_pause_resource_all.restype = [ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError) as e:
        log.info("no omp_pause_resource_all in %s (%s): OpenMP workers are left running", path, e)
        return None
    _lib = lib
    return lib


def release_openmp_workers() -> bool:
    """End the calling thread's OpenMP worker threads; True when libgomp did."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0

"""slick.train.memory: the allocator settings a CPU run applies, checked in fresh processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

# a training thread (not the main one) allocates, touches and frees a 48 MiB tensor 8 times
_LOOP = """
import json, resource, sys, threading
from slick.train.memory import tune_cpu_allocator as t
on = [t(), t()]
import torch
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096
def work(out):
    for _ in range(8):
        f0, r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, rss()
        x = torch.empty(12 * 2**20); x.fill_(1.0); del x
        out.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, rss() - r0))
out = []
th = threading.Thread(target=work, args=(out,)); th.start(); th.join()
print(json.dumps({"on": on, "faults": [f for f, _ in out], "growth": [g for _, g in out]}), flush=True)
import ctypes; ctypes.CDLL("libc.so.6").malloc_stats()   # one "Arena N:" block per arena, on stderr
"""


def _run(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SLICK_TUNE_ALLOCATOR", "THP_MEM_ALLOC_ENABLE",
                                                             "MALLOC_ARENA_MAX")}
    out = subprocess.run([sys.executable, "-c", _LOOP], capture_output=True, text=True, timeout=120,
                         env={**env, **env_extra})
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["arenas"] = sum(line.startswith("Arena ") for line in out.stderr.splitlines())
    return r


def test_one_arena_and_huge_pages_and_memory_is_returned():
    """With the settings the training thread allocates from the one (main) arena, and each iteration's fresh
    48 MiB costs at most ~600 faults (2 MiB pages, plus the 4 KiB pages of an unaligned edge); without them
    (glibc's and torch's defaults) the thread gets an arena of its own and pays one fault per 4 KiB: 12,288.
    Freed memory goes back to the OS either way: RSS does not grow from one iteration to the next."""
    on = _run({})
    assert on["on"] == [True, True]
    assert on["arenas"] == 1, on
    assert max(on["faults"]) < 1_000, on
    assert on["growth"][1:] == [0] * 7, on
    off = _run({"SLICK_TUNE_ALLOCATOR": "0"})
    assert off["on"] == [False, False]
    assert off["arenas"] >= 2, off
    assert min(off["faults"]) >= 12_000, off
    assert max(off["growth"][1:]) <= 1 << 20, off   # (a stray heap page or two)


def test_a_user_setting_for_huge_pages_is_kept():
    r = _run({"THP_MEM_ALLOC_ENABLE": "0"})
    assert r["on"] == [True, True]
    assert min(r["faults"]) >= 12_000, r


"""slick.train.memory: the allocator settings a CPU trainer applies, checked in fresh processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

# a training thread (not the main one) allocates, touches and frees a 48 MiB tensor 8 times
_LOOP = """
import json, resource, sys, threading
from slick.train.memory import keep_freed_memory as k
on = [k(), k()]
import torch
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096
def work(out):
    for _ in range(8):
        f0, r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, rss()
        t = torch.empty(12 * 2**20); t.fill_(1.0); del t
        out.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0, rss() - r0))
out = []
th = threading.Thread(target=work, args=(out,)); th.start(); th.join()
print(json.dumps({"on": on, "faults": [f for f, _ in out], "growth": [g for _, g in out]}))
"""


def _run(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("SLICK_KEEP_FREED_MEMORY", "THP_MEM_ALLOC_ENABLE",
                                                             "MALLOC_ARENA_MAX")}
    out = subprocess.run([sys.executable, "-c", _LOOP], capture_output=True, text=True, timeout=120,
                         env={**env, **env_extra})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_training_thread_reuses_freed_memory():
    """With the settings, the thread's 48 MiB blocks come from the main arena's heap and are reused: after the
    first two iterations no page faults beyond a few pages and no RSS growth. Without them (glibc's defaults)
    every iteration maps fresh memory: one fault per 4 KiB page, 12,288 per iteration."""
    on = _run({})
    assert on["on"] == [True, True]
    assert max(on["faults"][2:]) < 50, on
    assert on["growth"][2:] == [0] * 6, on
    off = _run({"SLICK_KEEP_FREED_MEMORY": "0"})
    assert off["on"] == [False, False]
    assert min(off["faults"]) >= 12_000, off


def test_huge_pages_off_keeps_glibc_returning_memory():
    """THP_MEM_ALLOC_ENABLE=0 is respected, and then freed memory is not kept: kept without huge pages, torch's
    aligned 48 MiB blocks do not fit each other's holes and RSS grows by 48 MiB per iteration. Here each
    iteration maps fresh pages (12,288 faults) and RSS does not grow."""
    r = _run({"THP_MEM_ALLOC_ENABLE": "0"})
    assert r["on"] == [True, True]
    assert min(r["faults"]) >= 12_000, r
    assert r["growth"][1:] == [0] * 7, r

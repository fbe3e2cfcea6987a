"""slick.loop.omp: a thread's OpenMP workers end when it releases them and come back on the next parallel op."""
from __future__ import annotations

import json
import subprocess
import sys

_CODE = """
import json, os, threading, time
import torch
from slick.loop.omp import release_openmp_workers
torch.set_num_threads(3)
x = torch.ones(2**22)
def tasks():
    # released workers end asynchronously: count once the number has held for 0.2 s (at most 5 s)
    n, since, end = -1, 0.0, time.monotonic() + 5
    while time.monotonic() < end:
        m = len(os.listdir("/proc/self/task"))
        if m != n:
            n, since = m, time.monotonic()
        elif time.monotonic() - since >= 0.2:
            break
        time.sleep(0.01)
    return n
def phase(out):
    release_openmp_workers(); out.append(tasks())                # none (creating x may have started some)
    x.add_(1); out.append(tasks())                               # this thread's team: +2 workers
    out.append(release_openmp_workers()); out.append(tasks())   # gone
    x.add_(1); out.append(tasks())                               # back
    out.append(release_openmp_workers()); out.append(tasks())
main = []
phase(main)
other = []
t = threading.Thread(target=phase, args=(other,)); t.start(); t.join()
print(json.dumps({"main": main, "other": other, "x": float(x[0])}))
"""


def test_release_ends_the_calling_threads_workers_only_until_the_next_parallel_op():
    out = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    n0 = r["main"][0]
    assert r["main"] == [n0, n0 + 2, True, n0, n0 + 2, True, n0]
    # on another thread (counted itself): its own team of 2 workers, released the same way
    assert r["other"] == [n0 + 1, n0 + 3, True, n0 + 1, n0 + 3, True, n0 + 1]
    assert r["x"] == 5.0

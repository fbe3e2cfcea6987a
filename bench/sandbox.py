"""Sandbox throughput: programs per second through the pool at 1, 2 and N workers, for a trivial program and for
a typical test set, and the sandbox's start-up cost against a bare subprocess of the same interpreter.

    python bench/sandbox.py [--programs 40] [--workers 1 2 4] [--out bench/results/sandbox.json]

"trivial" is ``print(1)``; "typical" is one code-reward sample with 10 stdin/stdout cases (10 programs, each a
small loop over its input), scored by CodeJudge. Start-up: the median wall time of ``print(1)`` run bare
(``python -I -c``) and in the sandbox, one at a time. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slick.reward.code import CodeJudge  # noqa: E402
from slick.reward.sandbox import Limits, SandboxPool  # noqa: E402

TYPICAL_CODE = "n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(x * x for x in xs[:n]))\n"
TYPICAL_LABEL = {"inputs": [f"{n}\n" + " ".join(map(str, range(n))) for n in range(5, 15)],
                 "outputs": [str(sum(x * x for x in range(n))) for n in range(5, 15)]}


def startup(pool: SandboxPool, repeats: int) -> dict:
    bare, boxed = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([pool.python, "-I", "-c", "print(1)"], capture_output=True, check=True)
        bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert pool.run("print(1)").ok
        boxed.append(time.perf_counter() - t0)
    return {"bare_ms": 1000 * statistics.median(bare), "sandbox_ms": 1000 * statistics.median(boxed)}


def throughput(workers: int, programs: int) -> dict:
    pool = SandboxPool(workers, Limits())
    t0 = time.perf_counter()
    results = pool.run_many([("print(1)", "")] * programs)
    trivial = programs / (time.perf_counter() - t0)
    assert all(r.ok for r in results)
    judge = CodeJudge(pool)
    samples = max(1, programs // 10)
    t0 = time.perf_counter()
    for _ in range(samples):
        assert judge(f"```python\n{TYPICAL_CODE}```", TYPICAL_LABEL).score == 1.0
    typical = samples / (time.perf_counter() - t0)
    pool.close()
    return {"workers": workers, "trivial_programs_per_s": trivial, "typical_samples_per_s": typical,
            "typical_programs_per_s": typical * len(TYPICAL_LABEL["inputs"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", type=int, default=40, help="trivial programs per measurement")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, os.cpu_count() or 1])
    p.add_argument("--repeats", type=int, default=20, help="start-up measurements")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sandbox.json"))
    a = p.parse_args(argv)
    pool = SandboxPool(1)
    pool.check()
    load = os.getloadavg()
    start = startup(pool, a.repeats)
    rows = [throughput(w, a.programs) for w in sorted(set(a.workers))]
    print(f"start-up, median of {a.repeats}: bare subprocess {start['bare_ms']:.1f} ms, "
          f"sandbox {start['sandbox_ms']:.1f} ms")
    print(f"{'workers':>7}  {'trivial programs/s':>18}  {'typical samples/s':>17}  {'typical programs/s':>18}")
    for r in rows:
        print(f"{r['workers']:>7}  {r['trivial_programs_per_s']:>18.1f}  {r['typical_samples_per_s']:>17.2f}  "
              f"{r['typical_programs_per_s']:>18.1f}")
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_start": load,
                          "load_average_end": os.getloadavg(), "python_in_sandbox": pool.python,
                          "root": os.geteuid() == 0},
              "startup": start, "throughput": rows, "typical_cases": len(TYPICAL_LABEL["inputs"]),
              "programs": a.programs, "command": "python bench/sandbox.py " + " ".join(argv or sys.argv[1:])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

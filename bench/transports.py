"""Seconds per weight update for each transport, sender in this process, one engine.

    .venv/bin/python bench/transports.py [--model DIR] [--dtype bf16|fp32] [--repeats 3] [--bucket-mb 64]

disk and broadcast send to a real `slick serve` subprocess, colocated to an in-process LocalEngine. The
tensors are the model's own (HF ``named_parameters``); each send includes the engine's load. Default model:
the prepared SmolLM2-135M-Instruct (``slick.models.smollm2``). Prints one line per transport.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def _run(model_dir: str, dtype: str, repeats: int, bucket: int, named, url: str) -> dict:
    from slick.engines.client import HttpEngine
    from slick.engine.local import LocalEngine
    from slick.weights.transport import make_transport

    res = {}
    http = HttpEngine([url])
    tmp = tempfile.mkdtemp(prefix="slick-bench-weights-")
    for name in ("disk", "broadcast"):
        tp = make_transport(name, disk_dir=str(Path(tmp) / "w"), bucket_bytes=bucket, timeout_s=600,
                            model_dir=model_dir, backend="gloo")
        t0 = time.perf_counter()
        await tp.connect([http])
        connect = time.perf_counter() - t0
        times = []
        for v in range(repeats):
            t0 = time.perf_counter()
            await tp.send(v + 1, named)
            times.append(time.perf_counter() - t0)
        await tp.disconnect()
        res[name] = ("slick serve subprocess", connect, times)
    await http.close()
    eng = LocalEngine(model_dir, dtype=dtype, device="cpu", max_running=2)
    tp = make_transport("colocated")
    await tp.connect([eng])
    times = []
    for v in range(repeats):
        t0 = time.perf_counter()
        await tp.send(v + 1, named)
        times.append(time.perf_counter() - t0)
    res["colocated"] = ("in-process LocalEngine", 0.0, times)
    await eng.close()
    return res


def main() -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from slick.engines.router import launch_workers

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF model directory (default: the prepared SmolLM2-135M).")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"], help="Sender and engine dtype.")
    p.add_argument("--repeats", type=int, default=3, help="Sends per transport (median reported).")
    p.add_argument("--bucket-mb", type=int, default=64, help="Bucket size in MiB (disk shards, broadcast calls).")
    a = p.parse_args()
    if a.model is None:
        from slick.models.smollm2 import prepare_smollm2
        a.model = str(prepare_smollm2())
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    named = [(n, p.detach()) for n, p in m.named_parameters()]
    mib = sum(t.numel() * t.element_size() for _, t in named) / 2**20
    (w,) = launch_workers(a.model, 1, dtype=a.dtype, startup_timeout=300)
    try:
        res = asyncio.run(_run(a.model, a.dtype, a.repeats, a.bucket_mb << 20, named, w.url))
    finally:
        w.stop()
    print(f"{a.model}: {a.dtype}, {mib:.1f} MiB, {len(named)} tensors, {a.bucket_mb} MiB buckets")
    for name, (engine, connect, times) in res.items():
        print(f"{name:10s} -> {engine:24s} connect {connect:.3f}s  send median {statistics.median(times):.3f}s "
              f"(min {min(times):.3f}s, {len(times)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Serving latency: 2 `slick serve` workers behind the real sglang-router, n concurrent /generate calls.

    python bench/serve_latency.py [--model DIR] [--n 256] [--new-tokens 32] [--dtype auto]

Prints a table and writes bench/results/serve_latency.json. Without --model, a tiny random Llama with
SmolLM2's tokenizer is built in a temporary directory. Timings on shared machines are noisy.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import aiohttp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slick.engines.router import launch_router, launch_workers  # noqa: E402

PROMPTS = [[1, 422, 2014, 314, 253, 1232, 30], [1, 9519, 28, 957, 314], [1, 2683, 1125, 17, 1068, 30, 216]]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[k]


async def _fire(url: str, n: int, new_tokens: int, temperature: float) -> tuple[list[float], int, float]:
    lat: list[float] = []
    tokens = 0
    conn = aiohttp.TCPConnector(limit=n)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=900)) as s:
        async def one(i: int):
            nonlocal tokens
            body = {"input_ids": PROMPTS[i % len(PROMPTS)], "return_logprob": True,
                    "sampling_params": {"max_new_tokens": new_tokens, "temperature": temperature,
                                        "sampling_seed": i}}
            t0 = time.perf_counter()
            async with s.post(url + "/generate", json=body) as r:
                out = await r.json()
                r.raise_for_status()
            lat.append(time.perf_counter() - t0)
            tokens += out["meta_info"]["completion_tokens"]

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    return lat, tokens, wall


def measure(model_dir: str, n_requests: int = 256, *, new_tokens: int = 32, temperature: float = 1.0,
            n_workers: int = 2, dtype: str = "auto") -> dict:
    """Launch ``n_workers`` workers + router, fire ``n_requests`` concurrent /generate calls, stop all.

    Returns p50/p99/mean latency (s), requests/s, generated tokens/s and the setup times.
    """
    t0 = time.perf_counter()
    workers = launch_workers(model_dir, n_workers, dtype=dtype, startup_timeout=600)
    t_workers = time.perf_counter() - t0
    router = None
    try:
        t1 = time.perf_counter()
        router = launch_router([w.url for w in workers])
        t_router = time.perf_counter() - t1
        asyncio.run(_fire(router.url, min(8, n_requests), 4, temperature))          # warm-up
        lat, tokens, wall = asyncio.run(_fire(router.url, n_requests, new_tokens, temperature))
    finally:
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()
    return {"model_dir": str(model_dir), "n_requests": n_requests, "new_tokens": new_tokens,
            "temperature": temperature, "n_workers": n_workers, "dtype": dtype,
            "p50_latency_s": _pct(lat, 0.50), "p99_latency_s": _pct(lat, 0.99),
            "mean_latency_s": statistics.fmean(lat), "wall_s": wall,
            "requests_per_s": n_requests / wall, "tokens_per_s": tokens / wall, "generated_tokens": tokens,
            "workers_start_s": t_workers, "router_start_s": t_router}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF model dir (default: tiny random Llama)")
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "serve_latency.json"))
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model
        if model is None:
            from slick.models.tiny import make_tiny_model
            model = str(make_tiny_model(os.path.join(tmp, "tiny")))
        r = measure(model, a.n, new_tokens=a.new_tokens, dtype=a.dtype)
    if a.model is None:
        r["model_dir"] = "tiny random llama (slick.models.tiny)"
    r.update({"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")})
    rows = [("requests", f"{r['n_requests']} x {r['new_tokens']} new tokens, T={r['temperature']}"),
            ("workers / router", f"{r['n_workers']} slick serve + sglang-router (round_robin)"),
            ("p50 latency", f"{r['p50_latency_s'] * 1000:.1f} ms"),
            ("p99 latency", f"{r['p99_latency_s'] * 1000:.1f} ms"),
            ("throughput", f"{r['requests_per_s']:.1f} req/s, {r['tokens_per_s']:.0f} tok/s"),
            ("startup", f"workers {r['workers_start_s']:.1f} s, router {r['router_start_s']:.1f} s")]
    w = max(len(k) for k, _ in rows)
    print(f"serve_latency  model: {r['model_dir']}")
    for k, v in rows:
        print(f"  {k:<{w}}  {v}")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(r, f, indent=2)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

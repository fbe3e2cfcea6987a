"""Benchmark: the in-process engine's decode speed against the sequences it runs at once (--engine-max-running).

    .venv/bin/python bench/engine_slots.py [--requests 400] [--new-tokens 48] [--slots 64,128,256,400] [--repeats 2]

One LocalEngine per slot count, SmolLM2-135M-Instruct in bf16, all ``--requests`` chat-templated questions
(~40 prompt tokens) submitted at once at T=1 (an evaluation's shape: ``bench/vs_trl.py`` evaluates 400), timed
in alternation (64, 128, ..., 64, 128, ...) so a slow spell hits every setting. Prints a table (median seconds,
tokens/s, the KV cache's bytes at the end) and writes bench/results/engine_slots.{md,json}. The automatic
--engine-max-running (``slick.config.auto.DECODE_PLATEAU_SEQS``) stops where more slots gain little.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.engine import make_prompts  # noqa: E402


def timed_round(eng, prompts, new_tokens: int) -> dict:
    from slick.types import SamplingParams

    async def run_all():
        sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
        return await asyncio.gather(*(eng.generate(p, sp) for p in prompts))

    t0 = time.perf_counter()
    gens = asyncio.run(run_all())
    dt = time.perf_counter() - t0
    tokens = sum(len(g.token_ids) for g in gens)
    return {"seconds": dt, "tokens": tokens, "tokens_per_sec": tokens / dt, "kv_cache_bytes": eng.cache.nbytes()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--slots", default="64,128,256,400", help="comma-separated --engine-max-running values")
    ap.add_argument("--repeats", type=int, default=2, help="alternating timed rounds of each setting")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine_slots"))
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from slick.engine.local import LocalEngine
    from slick.models.smollm2 import prepare_smollm2

    model_dir = prepare_smollm2()
    prompts = make_prompts(AutoTokenizer.from_pretrained(str(model_dir)), a.requests)
    slots = [int(s) for s in a.slots.split(",")]
    engines = {s: LocalEngine(model_dir, dtype="bf16", max_running=s, seed=0) for s in slots}
    runs: dict[int, list[dict]] = {s: [] for s in slots}
    try:
        for s in slots:                                      # warm-up: the kernels of every batch size once
            timed_round(engines[s], prompts[:s], 4)
        for i in range(a.repeats):
            for s in slots:
                runs[s].append(timed_round(engines[s], prompts, a.new_tokens))
                print(f"round {i + 1}/{a.repeats}: {s} slots {runs[s][-1]['seconds']:.2f} s", flush=True)
    finally:
        for eng in engines.values():
            eng.close_sync()
    rows = {s: {"median_seconds": statistics.median(r["seconds"] for r in rs),
                "median_tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in rs),
                "kv_cache_mib": max(r["kv_cache_bytes"] for r in rs) / 2**20} for s, rs in runs.items()}
    base = rows[slots[0]]["median_seconds"]
    head = (f"LocalEngine, SmolLM2-135M-Instruct bf16, {a.requests} requests (mean prompt "
            f"{sum(map(len, prompts)) / len(prompts):.0f} tokens) x up to {a.new_tokens} new tokens, T=1, "
            f"{torch.get_num_threads()} threads, median of {a.repeats} alternating rounds; load average at the end "
            f"{os.getloadavg()[0]:.2f}")
    lines = [head, "", f"| --engine-max-running | seconds | tokens/s | vs {slots[0]} | KV cache (MiB) |",
             "|---|---|---|---|---|"]
    lines += [f"| {s} | {r['median_seconds']:.2f} | {r['median_tokens_per_sec']:.0f} | "
              f"{base / r['median_seconds']:.2f}x | {r['kv_cache_mib']:.0f} |" for s, r in rows.items()]
    md = "\n".join(lines)
    print("\n" + md)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(md + "\n")
    out.with_suffix(".json").write_text(json.dumps({"config": vars(a), "rows": rows, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

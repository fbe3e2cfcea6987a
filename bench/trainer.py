"""Trainer throughput on SmolLM2-135M-Instruct: tokens/s and FLOP/s per precision scheme vs a bf16 matmul ceiling.

    .venv/bin/python bench/trainer.py [--samples 64] [--prompt-len 30] [--response-len 50] [--steps 2]
                                      [--schemes bf16,autocast,fp32] [--micro-batch-size 8] [--device auto]
                                      [--group-size 1] [--profile]

``--schemes autocast+hf,autocast`` compares the HF decoder layers with slick's fused ones in one run;
``autocast+recompute`` runs the fused layers with ``--recompute-mlp``.

Every scheme is built and warmed up first, then their timed steps interleave (a, b, a, b, ...; best of
``--steps`` each), so a slow spell of a shared machine hits all alike. Prints a table and writes
bench/results/trainer.json. ``--group-size 8`` gives every 8 consecutive samples
the same prompt (GRPO's layout: prompt sharing applies). ``--profile`` also splits one step into packing,
body forward, lm-head + logprob + entropy forward and backward, body backward, optimizer and other, for the
fused head (``chunked_logprobs``) and for the previous implementation (activation-checkpointed plain ops)
side by side in the same process, and writes them under ``"profile"``. Model FLOPs per step are counted as
6 x (non-embedding params) x (packed tokens; a shared prompt once) + 6 x (lm_head params) x (response tokens)
(the lm_head only runs on response positions) + attention score/value matmuls; the ceiling is the best
of a few square bf16 matmuls on the same device, measured before and after the steps.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slick.algo.batch import TrainBatch  # noqa: E402
from slick.config import Config  # noqa: E402
from slick.proc.memory import tcmalloc_loaded  # noqa: E402
from slick.train.trainer import Trainer  # noqa: E402
from slick.types import Sample  # noqa: E402


def matmul_ceiling(device: torch.device, dtype=torch.bfloat16, n: int = 2048, reps: int = 5) -> float:
    """Best observed FLOP/s of an n x n x n matmul."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = 0.0
    for _ in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t))
    return best


def step_flops(model, samples) -> float:
    """Approximate forward+backward FLOPs one train_step executes over ``samples``: a prompt shared by
    consecutive samples (prompt sharing) is counted once, with each response attending to it."""
    cfg = model.config
    emb = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings().weight
    total = sum(p.numel() for p in model.parameters())   # tied head counted once
    non_emb = total - emb
    tokens, pairs, prev = 0, 0.0, None
    for s in samples:
        p, r = len(s.prompt_ids), len(s.response_ids) - 1
        if s.prompt_ids != prev:          # a new prompt: its tokens and causal attention once
            tokens, pairs = tokens + p, pairs + p * p / 2
        tokens, pairs = tokens + r, pairs + r * p + r * r / 2
        prev = s.prompt_ids
    resp = sum(len(s.response_ids) for s in samples)
    attn = 4 * cfg.num_hidden_layers * cfg.hidden_size * pairs  # QK^T + AV, forward
    return 6 * non_emb * tokens + 6 * head.numel() * resp + 3 * attn


def make_batch(n: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0, group_size: int = 1):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % group_size == 0:
            p = [rng.randrange(100, vocab) for _ in range(prompt_len + rng.randint(-5, 5))]
        r = [rng.randrange(100, vocab) for _ in range(response_len + rng.randint(-10, 10))]
        out.append(Sample(index=i, group_index=i // group_size, prompt_ids=list(p), response_ids=r,
                          loss_mask=[1] * len(r)))
    return out


def loss_fn(x):
    """Sample-mean policy-gradient loss (the on-policy GRPO gradient); ``x`` is a slick.algo.LossInputs."""
    per = (x.advantages * x.logprobs * x.mask).sum(-1) / x.mask.sum(-1).clamp(min=1)
    loss = -per.sum() / x.num_samples
    return loss, {"pg_loss": float(loss.detach())}


def _checkpointed_head(hidden, lm_head, targets, temperature, chunk_size, with_entropy, entropy_grad):
    """The previous head: plain logits -> log_softmax per chunk under activation checkpointing."""
    from torch.utils.checkpoint import checkpoint

    from slick.train.logprobs import logprobs_from_logits

    def chunk(h, t):
        lp, ent = logprobs_from_logits(lm_head(h), t, temperature, with_entropy, entropy_grad)
        return lp, ent
    outs = [checkpoint(chunk, hidden[s:s + chunk_size], targets[s:s + chunk_size], use_reentrant=False)
            if hidden.shape[0] > chunk_size else chunk(hidden[s:s + chunk_size], targets[s:s + chunk_size])
            for s in range(0, hidden.shape[0], chunk_size)]
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def profile_step(tr: Trainer, samples, adv, head: str = "fused") -> dict:
    """Seconds of one train step by phase (same work as ``train_step``, timed piecewise)."""
    from slick.algo.inputs import LossInputs
    from slick.train.logprobs import chunked_logprobs
    from slick.train.packing import pad_stack

    def now():
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    t = dict.fromkeys(("packing", "forward", "head_forward", "head_backward", "backward", "optimizer"), 0.0)
    t_start = now()
    tr.optimizer.zero_grad(set_to_none=True)
    lm = tr.model
    for idx in tr._plan(samples)[0]:
        a = now()
        mb = tr._pack(samples, idx).to(tr.device)
        b = now()
        mask, segments = mb.attention()
        with tr._autocast():
            out = lm.base_model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False,
                                attention_mask=mask, slick_segments=segments)
            hidden = out.last_hidden_state[0].index_select(0, mb.gather_index)
        c = now()
        h = hidden.detach().requires_grad_(True)
        with tr._autocast():
            fn = chunked_logprobs if head == "fused" else _checkpointed_head
            lp, ent = fn(h, lm.get_output_embeddings(), mb.targets, tr.temperature, tr.cfg.logprob_chunk_size,
                         True, bool(tr.cfg.entropy_coef))
        T = max(mb.response_lengths)
        logprobs = pad_stack(list(lp.split(mb.response_lengths)), T, dtype=torch.float32)
        a_ = pad_stack([torch.as_tensor(adv[i]) for i in idx], T, dtype=torch.float32)
        m_ = pad_stack([torch.ones(len(samples[i].response_ids)) for i in idx], T, dtype=torch.float32)
        loss, _ = loss_fn(LossInputs(logprobs, None, m_.to(tr.device), a_.to(tr.device), num_samples=len(samples),
                                     num_tokens=int(sum(len(s.response_ids) for s in samples))))
        d = now()
        loss.backward()
        e = now()
        hidden.backward(h.grad)
        if tr.scheme == "bf16":
            tr._accumulate_master_grads()
        f = now()
        t["packing"] += b - a
        t["forward"] += c - b
        t["head_forward"] += d - c
        t["head_backward"] += e - d
        t["backward"] += f - e
    g = now()
    tr.optimizer_step()
    t["optimizer"] = now() - g
    t["total"] = now() - t_start
    t["other"] = t["total"] - sum(v for k, v in t.items() if k != "total")
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF dir (default: prepared SmolLM2-135M-Instruct)")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=30)
    ap.add_argument("--response-len", type=int, default=50)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per scheme (after 1 warm-up step)")
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--schemes", default="bf16,autocast,fp32",
                    help="comma-separated; a '+hf' suffix (autocast+hf) runs the HF decoder layers instead of "
                         "slick's fused ones (--disable-fused-layers), '+recompute' the fused ones with "
                         "--recompute-mlp")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--group-size", type=int, default=1, help="consecutive samples sharing one prompt")
    ap.add_argument("--profile", action="store_true", help="also time each phase of a step (fused vs previous head)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "trainer.json"))
    ap.add_argument("--head-only", type=int, default=0, metavar="ROWS",
                    help="only time the lm head + logprob + entropy on ROWS rows (SmolLM2 shapes), fused vs previous, "
                         "each in its own process, and print time and peak RSS")
    ap.add_argument("--head-impl", choices=["fused", "checkpoint"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.head_impl:
        print(json.dumps(head_only(args.head_impl, args.head_only)))
        return 0
    if args.head_only:
        import subprocess
        for impl in ("fused", "checkpoint"):
            out = subprocess.run([sys.executable, __file__, "--head-only", str(args.head_only), "--head-impl", impl],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"{impl:<11} rows {r['rows']}: best fwd+bwd {r['best_s'] * 1e3:.0f} ms, "
                  f"peak RSS above start {r['peak_rss_above_start_mib']:.0f} MiB")
        return 0
    if args.model is None:
        from slick.models.smollm2 import prepare_smollm2
        args.model = str(prepare_smollm2())
    rows = []
    ceiling = None
    runs = []   # (scheme, trainer, samples, advantages): every scheme built and warmed up first
    for scheme in args.schemes.split(","):
        base, _, layers = scheme.partition("+")     # "autocast+hf": the HF decoder layers, not the fused ones
        if layers not in ("", "hf", "recompute"):
            ap.error(f"--schemes: unknown suffix in {scheme!r} (+hf or +recompute)")
        dtype = "fp32" if base == "fp32" else "bf16"
        cfg = Config.from_flat(dict(hf_checkpoint=args.model, dtype=dtype, device=args.device, lr=1e-6,
                                    micro_batch_size=args.micro_batch_size, rm_type="exact",
                                    disable_fused_layers=layers == "hf", recompute_mlp=layers == "recompute"))
        tr = Trainer(cfg, precision=None if base == "fp32" else base)
        if ceiling is None:
            ceiling = matmul_ceiling(tr.device)
        samples = make_batch(args.samples, args.prompt_len, args.response_len, tr.model.config.vocab_size,
                             group_size=args.group_size)
        adv = [torch.randn(len(s.response_ids)) for s in samples]
        tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)  # warm-up
        runs.append((scheme, tr, samples, adv))
    # the schemes' timed steps interleave (a, b, a, b, ...): a slow spell of a shared machine, or the heap
    # growing under the first trainer, hits all of them alike
    metrics = {scheme: [] for scheme, *_ in runs}
    for _ in range(args.steps):
        for scheme, tr, samples, adv in runs:
            metrics[scheme].append(tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn))
    for scheme, tr, samples, adv in runs:
        times = [m["step_time"] for m in metrics[scheme]]
        m = metrics[scheme][-1]
        t = min(times)
        flops = step_flops(tr.model, samples)
        row = {"scheme": scheme, "device": str(tr.device), "step_s": t,
               "fwd_bwd_s": min(x["fwd_bwd_time"] for x in metrics[scheme]), "tokens": m["tokens"],
               "tokens_per_s": m["tokens"] / t, "tflops": flops / t / 1e12,
               "mfu_vs_bf16_matmul": flops / t / ceiling, "all_step_s": times}
        print(f"[{scheme}] step {t:.2f}s, {m['tokens'] / t:.0f} tok/s", flush=True)
        if args.profile:   # alternate the two heads, keep each phase's best of args.steps
            prof = {"fused": [], "checkpoint": []}
            for _ in range(args.steps):
                for head in prof:
                    prof[head].append(profile_step(tr, samples, adv, head))
            row["profile"] = {h: {k: min(p[k] for p in ps) for k in ps[0]} for h, ps in prof.items()}
            print_profile(scheme, row["profile"])
        rows.append(row)
    del runs
    # the ceiling again after the steps: on a shared machine one measurement can land in a slow spell; the best
    # of both is the conservative denominator
    ceiling_after = matmul_ceiling(torch.device(rows[0]["device"])) if rows else ceiling
    if ceiling_after > ceiling:
        for r in rows:
            r["mfu_vs_bf16_matmul"] *= ceiling / ceiling_after
        ceiling = ceiling_after
    print(f"device={rows and args.device} torch={torch.__version__} threads={torch.get_num_threads()} "
          f"bf16 matmul ceiling={ceiling / 1e12:.3f} TFLOP/s")
    print(f"{'scheme':<10}{'step s':>9}{'fwd+bwd s':>11}{'tokens':>8}{'tok/s':>9}{'TFLOP/s':>9}{'of ceiling':>12}")
    for r in rows:
        print(f"{r['scheme']:<10}{r['step_s']:>9.2f}{r['fwd_bwd_s']:>11.2f}{int(r['tokens']):>8}"
              f"{r['tokens_per_s']:>9.0f}{r['tflops']:>9.3f}{r['mfu_vs_bf16_matmul']:>11.1%}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "bench": "trainer", "model": args.model, "samples": args.samples, "prompt_len": args.prompt_len,
        "response_len": args.response_len, "micro_batch_size": args.micro_batch_size,
        "device": str(args.device), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "bf16_matmul_ceiling_flops": ceiling,
        "allocator": "tcmalloc" if tcmalloc_loaded() else "glibc",
        "rows": rows, "peak_rss_mib_all_schemes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "note": "shared machine: timings are noisy; the schemes' steps interleave",
    }, indent=2))
    print(f"wrote {out}")
    return 0


def head_only(impl: str, rows: int, hidden: int = 576, vocab: int = 49152, reps: int = 3) -> dict:
    """The lm head + logprob + entropy alone (fp32, entropy differentiated): best fwd+bwd time and the peak
    RSS above the start of this process. Run each ``impl`` in its own process (peak RSS only grows)."""
    import resource

    from slick.train.logprobs import chunked_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    h = torch.randn(rows, hidden, requires_grad=True)
    tgt = torch.randint(0, vocab, (rows,))
    fn = chunked_logprobs if impl == "fused" else _checkpointed_head
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        lp, ent = fn(h, head, tgt, 1.0, 512, True, True)
        (lp.sum() + ent.sum()).backward()
        times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - start
    return {"impl": impl, "rows": rows, "best_s": min(times), "peak_rss_above_start_mib": peak}


def print_profile(scheme: str, prof: dict) -> None:
    keys = ["packing", "forward", "head_forward", "head_backward", "backward", "optimizer", "other", "total"]
    print(f"[{scheme}] profile (ms, best of runs)   " + "".join(f"{k:>14}" for k in keys))
    for head, t in prof.items():
        print(f"  {head:<33}" + "".join(f"{t[k] * 1e3:>14.0f}" for k in keys))


if __name__ == "__main__":
    from slick.proc.memory import use_tcmalloc

    use_tcmalloc()   # the allocator `slick train` runs with
    raise SystemExit(main())

"""Benchmark: the trainer's elementwise kernels (RMSNorm, RoPE, SwiGLU, logprob chunks), torch against the native
ones (``slick/train/native_fused.py``), alone and inside whole train steps, side by side in one invocation.

    .venv/bin/python bench/native_fused.py [--steps 4] [--tokens 2277] [--out bench/results/native_fused.json]

Kernels, SmolLM2's shapes over ``--tokens`` rows, median of 30 calls each: the norm's forward with its bf16 cast
and its backward (fp32 residual, bf16 output gradient), RoPE of the 9 query heads forward (bf16 view of the qkv
rows) and backward (fp32), the SwiGLU product forward and backward (bf16 gate/up of 2 x 1,536); the lm head's
logprobs and entropy over 1,425 positions (the step's response tokens) of SmolLM2's vocabulary in chunks of 128,
forward and backward, best of 5. Steps: ``bench/step_profile.py``'s batch (SmolLM2-135M's
shapes with random weights, 8 prompts x 8 samples, responses of 12-48 tokens, the trainer ``slick train`` builds
with no flags), the step timed with the native kernels and with the torch paths in alternation, ``--steps`` each;
best and median. Runs under tcmalloc where installed, as `slick train` does. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.step_profile import build, make_batch, smollm2_shaped  # noqa: E402
from bench.trainer import loss_fn  # noqa: E402
from slick.algo.batch import TrainBatch  # noqa: E402
from slick.train import native_fused  # noqa: E402
from slick.train.fused_layers import rms_norm, rms_norm_backward, rope, rope_backward  # noqa: E402
from slick.train.logprobs import chunked_logprobs  # noqa: E402
from slick.proc.memory import tcmalloc_loaded  # noqa: E402


def median_ms(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def torch_paths():
    """A context in which the trainer takes its torch paths (``native_fused.get`` returns None)."""
    class Off:
        def __enter__(self):
            self.get, native_fused.get = native_fused.get, lambda: None

        def __exit__(self, *exc):
            native_fused.get = self.get
    return Off()


def swiglu_torch(gu: torch.Tensor, da=None):
    """mlp_forward's / mlp_backward's torch path for the SwiGLU product (and its gradients with ``da``)."""
    g, u = gu.chunk(2, -1)
    sg = torch.nn.functional.silu(g)
    h = sg * u
    if da is None:
        return h
    dgu = torch.empty_like(gu)
    dg, du = dgu.chunk(2, -1)
    torch.mul(da, sg, out=du)
    torch.mul(da, u, out=dg)
    torch.ops.aten.silu_backward.grad_input(dg, g, grad_input=dg)
    return h, dgu


def logprob_seconds(n: int = 1425, hidden: int = 576, vocab: int = 49152) -> float:
    """Best of 5: chunked_logprobs forward and backward (logprob and entropy terms) over ``n`` positions."""
    h = torch.randn(n, hidden).requires_grad_(True)
    head = torch.nn.Linear(hidden, vocab, bias=False)
    targets = torch.randint(0, vocab, (n,))
    ts = []
    for _ in range(6):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp, ent = chunked_logprobs(h, head, targets, 1.0, 128, True, True)
        (lp.sum() + 0.01 * ent.sum()).backward()
        ts.append(time.perf_counter() - t0)
    return min(ts[1:])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2277)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "native_fused.json"))
    a = ap.parse_args(argv)
    k = native_fused.get()
    if k is None:
        ap.error("the native kernels are not available here (no compiler, or SLICK_NATIVE=0)")
    torch.manual_seed(0)
    x, w = torch.randn(a.tokens, 576), torch.randn(576)
    dy = torch.randn(a.tokens, 576).to(torch.bfloat16)
    r = rms_norm(x, w, 1e-5)[1]
    kernels = {"forward": (median_ms(lambda: rms_norm(x, w, 1e-5)[0].to(torch.bfloat16)),
                           median_ms(lambda: k.norm_forward(x, w, 1e-5)))}
    with torch_paths():
        t_bwd = median_ms(lambda: rms_norm_backward(x, w, r, dy))
        t_lp = logprob_seconds() * 1e3
    kernels["backward"] = (t_bwd, median_ms(lambda: rms_norm_backward(x, w, r, dy)))
    q = torch.randn(a.tokens, 15 * 64).to(torch.bfloat16)[:, :9 * 64].view(a.tokens, 9, 64)
    ang = torch.randn(a.tokens, 1, 64)
    cos, sin, gq = ang.cos(), ang.sin(), torch.randn(a.tokens, 9, 64)
    with torch_paths():
        t_rope_b = median_ms(lambda: rope_backward(gq, cos, sin))
    kernels["RoPE forward"] = (median_ms(lambda: rope(q, cos, sin).to(torch.bfloat16)),
                               median_ms(lambda: k.rope_forward(q, cos, sin)))
    kernels["RoPE backward"] = (t_rope_b, median_ms(lambda: k.rope_backward(gq, cos, sin)))
    gu, da = torch.randn(a.tokens, 2 * 1536).to(torch.bfloat16), torch.randn(a.tokens, 1536).to(torch.bfloat16)
    kernels["SwiGLU forward"] = (median_ms(lambda: swiglu_torch(gu)), median_ms(lambda: k.swiglu_forward(gu)))
    kernels["SwiGLU backward"] = (median_ms(lambda: swiglu_torch(gu, da)), median_ms(lambda: k.swiglu_backward(gu, da)))
    kernels["logprobs"] = (t_lp, logprob_seconds() * 1e3)

    with tempfile.TemporaryDirectory() as work:
        model_dir = smollm2_shaped(Path(work) / "model")
        samples = make_batch(model_dir, 8, 8, 48)
        tr = build(model_dir, "auto", 48)
    adv = [torch.randn(len(s.response_ids)) for s in samples]
    steps: dict[str, list[float]] = {"torch": [], "native": []}
    tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)      # warm-up: AdamW's state, first touch of the heap
    with torch_paths():
        tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)
    for _ in range(a.steps):
        with torch_paths():
            steps["torch"].append(tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)["step_time"])
        steps["native"].append(tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)["step_time"])
    tokens = int(tr.train_step(TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=adv), loss_fn)["tokens"])
    lines = [f"The trainer's elementwise kernels, torch vs native, {torch.get_num_threads()} threads, allocator "
             f"{'tcmalloc' if tcmalloc_loaded() else 'glibc'}, load average at the end {os.getloadavg()[0]:.2f}", "",
             "| what | torch | native | speed-up |", "|---|---|---|---|"]
    for name, (t, n) in kernels.items():
        what = {"forward": f"RMSNorm forward, [{a.tokens}, 576] (ms, median of 30)",
                "backward": f"RMSNorm backward, [{a.tokens}, 576] (ms, median of 30)",
                "logprobs": "logprobs + entropy, forward and backward, 1,425 positions x 49,152 (ms, best of 5)"
                }.get(name, f"{name}, {a.tokens} rows (ms, median of 30)")
        lines.append(f"| {what} | {t:.1f} | {n:.1f} | {t / n:.2f}x |" if name == "logprobs" else
                     f"| {what} | {t:.3f} | {n:.3f} | {t / n:.2f}x |")
    for stat, f in (("best", min), ("median", statistics.median)):
        t, n = f(steps["torch"]), f(steps["native"])
        lines.append(f"| train step, {tokens} packed tokens, SmolLM2-135M shapes (s, {stat} of {a.steps}) | {t:.3f} | "
                     f"{n:.3f} | {t / n:.2f}x |")
    md = "\n".join(lines)
    print(md)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(a), "kernels_ms": kernels, "steps_s": steps, "tokens": tokens,
                               "table": md}, indent=2))
    return 0


if __name__ == "__main__":
    from slick.proc.memory import use_tcmalloc

    use_tcmalloc()   # the allocator `slick train` runs with
    raise SystemExit(main())

"""Benchmark: the trainer's RMSNorm, torch against the native kernels (``slick/train/native_norm.py``), alone and
inside whole train steps, side by side in one invocation.

    .venv/bin/python bench/native_norm.py [--steps 4] [--tokens 2277] [--out bench/results/native_norm.json]

Kernels: SmolLM2's hidden size (576), ``--tokens`` rows of an fp32 residual, bf16 output gradient: the forward
with its bf16 cast and the backward, median of 30 calls each. Steps: ``bench/step_profile.py``'s batch (SmolLM2-135M's
shapes with random weights, 8 prompts x 8 samples, responses of 12-48 tokens, the trainer ``slick train`` builds
with no flags), the step timed with the native norms and with the torch ones in alternation, ``--steps`` each;
best and median. Prints a table and writes JSON.
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
from slick.train import native_norm  # noqa: E402
from slick.train.fused_layers import rms_norm, rms_norm_backward  # noqa: E402


def median_ms(fn, n: int = 30) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def torch_norms():
    """A context in which the fused layers take the torch path (``native_norm.get`` returns None)."""
    class Off:
        def __enter__(self):
            self.get, native_norm.get = native_norm.get, lambda: None

        def __exit__(self, *exc):
            native_norm.get = self.get
    return Off()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2277)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "native_norm.json"))
    a = ap.parse_args(argv)
    k = native_norm.get()
    if k is None:
        ap.error("the native RMSNorm kernels are not available here (no compiler, or SLICK_NATIVE=0)")
    torch.manual_seed(0)
    x, w = torch.randn(a.tokens, 576), torch.randn(576)
    dy = torch.randn(a.tokens, 576).to(torch.bfloat16)
    r = rms_norm(x, w, 1e-5)[1]
    kernels = {"forward": (median_ms(lambda: rms_norm(x, w, 1e-5)[0].to(torch.bfloat16)),
                           median_ms(lambda: k.forward(x, w, 1e-5)))}
    with torch_norms():
        t_bwd = median_ms(lambda: rms_norm_backward(x, w, r, dy))
    kernels["backward"] = (t_bwd, median_ms(lambda: rms_norm_backward(x, w, r, dy)))

    with tempfile.TemporaryDirectory() as work:
        model_dir = smollm2_shaped(Path(work) / "model")
        samples = make_batch(model_dir, 8, 8, 48)
        tr = build(model_dir, "auto", 48)
    adv = [torch.randn(len(s.response_ids)) for s in samples]
    steps: dict[str, list[float]] = {"torch": [], "native": []}
    tr.train_step(samples, adv, loss_fn)      # warm-up: AdamW's state, first touch of the heap
    with torch_norms():
        tr.train_step(samples, adv, loss_fn)
    for _ in range(a.steps):
        with torch_norms():
            steps["torch"].append(tr.train_step(samples, adv, loss_fn)["step_time"])
        steps["native"].append(tr.train_step(samples, adv, loss_fn)["step_time"])
    tokens = int(tr.train_step(samples, adv, loss_fn)["tokens"])
    lines = [f"RMSNorm, torch vs native, {torch.get_num_threads()} threads, load average at the end "
             f"{os.getloadavg()[0]:.2f}", "",
             "| what | torch | native | speed-up |", "|---|---|---|---|"]
    for name, (t, n) in kernels.items():
        lines.append(f"| {name}, [{a.tokens}, 576] fp32 (ms, median of 30) | {t:.3f} | {n:.3f} | {t / n:.2f}x |")
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
    raise SystemExit(main())

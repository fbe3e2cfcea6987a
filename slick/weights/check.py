"""After a weight sync: did the new weights land? The engines' versions and a probe's logprobs, against the trainer.

:func:`check_engine_weights` runs when the driver has finished a sync (the engines generate again):

1. every engine server (``control_urls`` of an HTTP engine, else the engine) reports the trainer's version;
2. the engine generates a short probe greedily (``top_k = 1`` at the rollout temperature, so the logprobs are
   those of the untruncated ``softmax(logits / T)``) and the trainer scores the same tokens; the largest
   difference must be within ``tol``.

A failed check raises :class:`WeightSyncError` (the run stops): an adapter or weight update that did not reach the
engine is an error, never silent staleness. It checks merged-weight syncs and adapter-only ones
(``slick.weights.lora_sync``) alike: the probe sees whatever the engine serves, adapter included. It is on with LoRA (``--lora-rank``/``--lora-load``), where an
update that merged nothing would leave the engine on the base weights, and whenever ``--weight-check-tol`` is set.
The default bound is 1e-3 when trainer and engine compute in fp32 and 0.5 in bf16 (both numerics differ by
roundings only, up to 0.16 measured in bf16 (docs/lora.md); a probe of a dropped update differs by the update's effect: see docs/lora.md for what that
catches and what it cannot).
"""
from __future__ import annotations

import math
from typing import Awaitable, Callable, Optional, Sequence

from slick.config import Config
from slick.types import Sample, SamplingParams

PROBE_TEXT = "The weight check asks the engine to continue this sentence:"
PROBE_TOKENS = 8
FP32_TOL, BF16_TOL = 1e-3, 0.5


class WeightSyncError(RuntimeError):
    """The engines do not hold the weights the trainer sent."""


def check_tolerance(cfg: Config, dtype) -> Optional[float]:
    """The bound the check uses, or None when the check is off (module doc)."""
    if cfg.weight_check_tol is not None:
        return float(cfg.weight_check_tol)
    if not (cfg.lora_rank or cfg.lora_load):
        return None
    return FP32_TOL if str(dtype).endswith("float32") else BF16_TOL


def probe_ids(tokenizer) -> list[int]:
    return list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False)) if tokenizer is not None else \
        list(range(100, 116))


async def _versions(engine) -> dict:
    urls = list(getattr(engine, "control_urls", None) or [])
    if urls and hasattr(engine, "weight_version_of"):
        return {u: int(await engine.weight_version_of(u)) for u in urls}
    return {getattr(engine, "url", "the engine"): int(await engine.get_weight_version())}


async def check_engine_weights(trainer, engine, tol: float,
                               compute: Callable[[Sequence], Awaitable[list]]) -> dict:
    """Check ``engine`` against ``trainer`` (module doc); ``compute(samples)`` runs ``trainer.compute_logprobs``
    where the trainer may run (the driver's training thread). Returns ``{"perf/weight_check_max_abs_diff": d}``."""
    version = int(trainer.version)
    stale = {u: v for u, v in (await _versions(engine)).items() if v != version}
    if stale:
        raise WeightSyncError(f"weight check after the sync of version {version}: "
                              + ", ".join(f"{u} reports version {v}" for u, v in stale.items()))
    prompt = probe_ids(getattr(trainer, "tokenizer", None))
    sampling = SamplingParams(temperature=float(trainer.temperature), top_k=1, max_new_tokens=PROBE_TOKENS,
                              ignore_eos=True)
    gen = await engine.generate(prompt, sampling)
    if gen.weight_version is not None and int(gen.weight_version) != version:
        raise WeightSyncError(f"weight check: the probe was generated with weight version {gen.weight_version}, "
                              f"the trainer is at {version}")
    ours = (await compute([Sample(index=-1, prompt_ids=prompt, response_ids=list(gen.token_ids))]))[0]
    diff = max((abs(float(a) - float(b)) for a, b in zip(ours.tolist(), gen.logprobs)), default=0.0)
    if not math.isfinite(diff) or diff > tol:
        raise WeightSyncError(f"weight check after the sync of version {version}: the engine's logprobs of a "
                              f"{len(gen.token_ids)}-token probe differ from the trainer's by up to {diff:.3g} "
                              f"(bound {tol:g}, --weight-check-tol): the engine does not hold the trainer's weights "
                              f"(an update, or an adapter, that did not land)")
    return {"perf/weight_check_max_abs_diff": diff}

"""The per-step train/inference mismatch probe over the whole vocabulary (docs/vllm.md, "Train/inference mismatch").

For ``--mismatch-probe-samples`` samples of the step, the engine returns its top-k next-token logprobs at every
position (``prompt_top_logprobs``: slick's LocalEngine, HttpEngine over slick serve or SGLang, vLLM), the trainer
scores the same tokens (``candidate_logprobs``), and
``slick.algo.correction.coarse_kl`` gives KL(engine || trainer) per response position over the top-k tokens plus the
rest of the vocabulary. Runs while engine and trainer hold the same weights; engines or trainers without those
methods (Ray trainer groups) log nothing.
"""
from __future__ import annotations

from typing import Awaitable, Callable, Sequence

from slick.algo.correction import coarse_kl


async def probe_mismatch(engine, trainer, samples: Sequence, n: int, k: int,
                         in_trainer: Callable[..., Awaitable]) -> dict:
    """``train/mismatch_kl_mean`` / ``_max`` over the response positions of the first ``n`` samples with a
    response; ``in_trainer(fn, *args)`` runs ``fn`` on the trainer's thread."""
    if n <= 0 or not hasattr(engine, "prompt_top_logprobs"):
        return {}
    kls: list[float] = []
    for s in [s for s in samples if s.response_ids][:n]:
        ids = list(s.prompt_ids) + list(s.response_ids)
        top = await engine.prompt_top_logprobs(ids, k)           # top[i] predicts ids[i + 1]
        first = len(s.prompt_ids) - 1                            # the position that predicts the first response token
        cands = [[] if i < first else list(top[i]) for i in range(len(top))]
        mine = await in_trainer(trainer.candidate_logprobs, ids, cands)
        if mine is None:                                         # the trainer does not offer it (a sharded rank)
            return {}
        kls += [coarse_kl(top[i], mine[i]) for i in range(first, len(top))]
    if not kls:
        return {}
    return {"train/mismatch_kl_mean": sum(kls) / len(kls), "train/mismatch_kl_max": max(kls)}

"""The trainer's side of the mismatch probe: next-token logprobs of chosen tokens at every position of a sequence.

The engine names, per position, its top-k tokens (and the token that follows); the trainer scores the same tokens
under the actor at temperature 1 so that ``slick.algo.correction.coarse_kl`` can compare the two distributions
over the whole vocabulary (top-k + the rest). One unpacked forward of one sequence, no gradient.
"""
from __future__ import annotations

from typing import Sequence

import torch


def candidate_logprobs(model, token_ids: Sequence[int], candidates: Sequence[Sequence[int]], device,
                       autocast) -> list[dict]:
    """``[{token: logprob}]`` for positions 1..n-1 of ``token_ids`` (the distribution that predicts token i, over
    ``candidates[i - 1]``), fp32."""
    if len(candidates) != len(token_ids) - 1:
        raise ValueError(f"{len(candidates)} candidate sets for {len(token_ids)} tokens (need one per position 1..n-1)")
    ids = torch.tensor([list(token_ids)], device=device)
    pos = torch.arange(ids.shape[1], device=device)[None]
    with torch.no_grad(), autocast:
        logits = model(input_ids=ids, position_ids=pos).logits[0, :-1]
    logp = torch.log_softmax(logits.float(), -1).cpu()
    return [{int(t): float(logp[i, int(t)]) for t in cand} for i, cand in enumerate(candidates)]

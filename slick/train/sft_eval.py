"""Held-out SFT statistics from the trainer: per chat, the logprob of each response token and whether it is the
model's argmax (token accuracy).

Logprobs come from the trainer protocol (``compute_logprobs``: any trainer, one process or Ray ranks). The argmax
needs the logits, so token accuracy is computed with the trainer's own model in one process (``trainer.model``);
a trainer without one (Ray ranks) reports the loss only.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


@torch.no_grad()
def sft_token_stats(trainer, samples: Sequence) -> tuple[list, Optional[list]]:
    """(logprobs, correct): per sample a 1-D float tensor over its response tokens, and a 1-D bool tensor (the
    token is the argmax) or None when the trainer has no model in this process."""
    logprobs = trainer.compute_logprobs(list(samples), "actor")
    model = getattr(trainer, "model", None)
    if model is None or getattr(trainer, "fsdp", False):
        return logprobs, None
    correct = []
    was_training = model.training
    model.eval()
    try:
        ctx = trainer._autocast() if hasattr(trainer, "_autocast") else torch.autocast("cpu", enabled=False)
        with ctx:
            for s in samples:
                ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)], device=trainer.device)
                logits = model(input_ids=ids).logits[0]
                p, r = len(s.prompt_ids), len(s.response_ids)
                pred = logits[p - 1:p - 1 + r].argmax(-1).cpu()
                correct.append(pred == torch.tensor(list(s.response_ids)))
    finally:
        model.train(was_training)
    return logprobs, correct

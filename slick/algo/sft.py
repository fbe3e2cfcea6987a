"""Supervised fine-tuning as a loss: the negative log-likelihood of the trained (assistant) tokens.

::

    loss = reduce(-logprobs, mask)        # mask: 1 on assistant tokens, 0 on prompt, user and tool tokens

``reduce`` is slick's (``slick.algo.reduce``): the mean over samples of each sample's token mean, or with
``cfg.calculate_per_token_loss`` the mean over every trained token of the global batch. With the global
normalisers of ``LossInputs`` the micro-batch losses sum to the global-batch loss, as for the policy objective.
:func:`sft_objective` has the loss-function signature (``fn(cfg, inputs: LossInputs) -> (loss, metrics)``); it
reads no advantage, old or reference logprob. :func:`sft_eval_metrics` turns held-out logprobs into the eval
loss, perplexity and token accuracy.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from .inputs import LossInputs
from .params import AlgoParams
from .reduce import reduce


def sft_loss(logprobs: Tensor, mask: Tensor, per_token: bool, num_samples=None, num_tokens=None) -> Tensor:
    """The NLL of ``logprobs`` [B, T] over ``mask`` [B, T], reduced per token or per sample (module doc)."""
    return reduce(-logprobs.float(), mask.float(), per_token, num_samples=num_samples, num_tokens=num_tokens)


def sft_objective(cfg: AlgoParams, inputs: LossInputs) -> tuple[Tensor, dict[str, float]]:
    """The SFT loss of one packed micro-batch, and its metrics ("loss", "sft_loss", "entropy_loss"), each
    reduced like the loss so the micro-batch metrics sum to the global batch's."""
    per_token = bool(cfg.calculate_per_token_loss)
    mask = inputs.mask.float()
    loss = sft_loss(inputs.logprobs, mask, per_token, inputs.num_samples, inputs.num_tokens)
    metrics = {"loss": float(loss.detach()), "sft_loss": float(loss.detach())}
    if inputs.entropy is not None:
        metrics["entropy_loss"] = float(reduce(inputs.entropy.float().detach(), mask, per_token,
                                               num_samples=inputs.num_samples, num_tokens=inputs.num_tokens))
    return loss, metrics


def sft_eval_metrics(logprobs: Sequence[Tensor], correct: Sequence[Tensor] | None,
                     masks: Sequence[Sequence[int]]) -> dict[str, float]:
    """Held-out metrics from per-sample response-token ``logprobs`` (1-D), ``correct`` (1-D bool: the token is
    the model's argmax; None when not computed) and loss ``masks``, all over the masked tokens of every sample:
    "loss" (mean NLL per token), "ppl" (exp of it), "token_acc" (fraction of argmax hits), "tokens"."""
    nll, hits, n = 0.0, 0.0, 0
    for i, (lp, m) in enumerate(zip(logprobs, masks)):
        m = torch.as_tensor(list(m), dtype=torch.float32)
        if lp.shape[0] != m.shape[0]:
            raise ValueError(f"sft_eval_metrics: sample {i} has {lp.shape[0]} logprobs for {m.shape[0]} mask entries")
        nll -= float((lp.float() * m).sum())
        n += int(m.sum())
        if correct is not None:
            hits += float((correct[i].float() * m).sum())
    if n == 0:
        raise ValueError("sft_eval_metrics: no trained token in the held-out chats")
    out = {"loss": nll / n, "ppl": math.exp(min(nll / n, 50.0)), "tokens": float(n)}
    if correct is not None:
        out["token_acc"] = hits / n
    return out

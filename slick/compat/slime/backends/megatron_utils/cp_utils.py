"""slime's context-parallel helpers as loss plug-ins call them (``--custom-tis-function-path``,
``--custom-pg-loss-reducer-function-path``, docs/slime.md). slick has no context parallelism: every rank holds
whole responses, so gathering and slicing return what they are given, and ``get_sum_of_sample_mean`` is
slime's single-rank reduction. ``total_lengths`` may hold slick's placeholders (slick/algo/slime_loss.py): these
functions pass them along without reading them."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch


def get_sum_of_sample_mean(total_lengths: Sequence, response_lengths: Sequence[int], loss_masks: Sequence,
                           sample_denoms: Optional[Sequence] = None,
                           calculate_per_token_loss: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """A reducer of a packed per-token tensor (the responses one after the other): the sum over samples of each
    sample's masked sum divided by its denominator (``sample_denoms``, or its mask's sum; at least 1), or with
    ``calculate_per_token_loss`` the masked sum over every token."""
    lengths = [int(n) for n in response_lengths]
    denoms = [m.sum() for m in loss_masks] if sample_denoms is None else list(sample_denoms)

    def per_sample_means(x: torch.Tensor) -> torch.Tensor:
        parts = [(xi * mi).sum() / torch.clamp_min(torch.as_tensor(d, dtype=xi.dtype, device=xi.device), 1)
                 for xi, mi, d in zip(x.split(lengths, dim=0), loss_masks, denoms)]
        return torch.stack(parts).sum() if parts else x.sum() * 0

    def token_sum(x: torch.Tensor) -> torch.Tensor:
        parts = [(xi * mi).sum() for xi, mi in zip(x.split(lengths, dim=0), loss_masks)]
        return torch.stack(parts).sum() if parts else x.sum() * 0

    return token_sum if calculate_per_token_loss else per_sample_means


def all_gather_with_cp(tensor: torch.Tensor, total_length, response_length) -> torch.Tensor:
    """One sample's per-token values from every context-parallel rank: with none, ``tensor`` itself."""
    return tensor


def slice_log_prob_with_cp(log_prob, total_length, response_length):
    """This rank's share of one sample's per-token values: with no context parallelism, all of them."""
    if len(log_prob) != int(response_length):
        raise ValueError(f"slice_log_prob_with_cp: {len(log_prob)} values for a response of {response_length} "
                         f"tokens")
    return log_prob


def get_logits_and_tokens_offset_with_cp(total_length, response_length):
    raise NotImplementedError("slick has no context parallelism: a sample's tokens are all on one rank")

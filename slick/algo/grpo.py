"""GRPO / GSPO / Dr.GRPO advantages: group-relative, broadcast over each sample's tokens.

For a group of rewards ``r_1..r_n`` (one prompt, ``n = group_size`` samples)::

    A_i = (r_i - mean(r)) / (std(r) + 1e-6)

``std`` is ``torch.std``'s default, the *unbiased* (n-1) estimate, as in slime.
A group of one has no spread: its advantage is 0 (not NaN). A group whose
rewards are all equal gets 0 for every sample.

Flags (``inputs.cfg``, an :class:`AlgoParams`):

* ``disable_grpo_std_normalization`` - no division by the std (Dr.GRPO).
* ``disable_rewards_normalization`` - the raw reward is the advantage.

The sample's advantage is written on every token where ``mask`` is set; returns
equal the advantages (there is no critic). GSPO uses the same advantages; it
differs only in the sequence-level ratio of its loss (see ``policy_loss``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .inputs import AdvantageInputs, AdvantageOutputs
from .utils import broadcast_to_tokens, check_groups

STD_EPS = 1e-6


def group_normalized_rewards(rewards: Tensor, group_size: int, *, divide_by_std: bool = True) -> Tensor:
    """Per-sample ``r - group mean`` (optionally ``/ (unbiased group std + 1e-6)``), shape [B]."""
    grouped = rewards.view(-1, group_size)
    centered = grouped - grouped.mean(dim=-1, keepdim=True)
    if divide_by_std:
        if group_size > 1:
            std = grouped.std(dim=-1, keepdim=True)
        else:
            std = torch.zeros_like(centered)
        centered = centered / (std + STD_EPS)
    return centered.reshape(-1)


def grpo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """GRPO advantages [B, T] and returns [B, T] (returns == advantages)."""
    mask = inputs.mask
    grouped = check_groups(inputs.rewards, mask, inputs.group_size)
    params = inputs.params("grpo")
    flat = grouped.reshape(-1)
    if params.disable_rewards_normalization:
        per_sample = flat
    else:
        per_sample = group_normalized_rewards(
            flat, inputs.group_size, divide_by_std=not params.disable_grpo_std_normalization
        )
    adv = broadcast_to_tokens(per_sample, mask.float())
    return AdvantageOutputs(adv, adv.clone())


def gspo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """GSPO advantages: identical to :func:`grpo` (the difference lives in the loss)."""
    return grpo(inputs)

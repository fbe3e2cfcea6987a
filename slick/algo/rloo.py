"""RLOO (REINFORCE leave-one-out) advantages.

Each sample's baseline is the mean reward of the *other* samples of its group::

    A_i = r_i - (sum_j r_j - r_i) / (n - 1)        (= n/(n-1) * (r_i - mean(r)))

A group of one has no other sample: its advantage is 0. The value is written
on every masked token; returns equal the advantages. ``inputs.cfg`` is not read (None is fine).
"""
from __future__ import annotations

import torch

from .inputs import AdvantageInputs, AdvantageOutputs
from .utils import broadcast_to_tokens, check_groups


def rloo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """RLOO advantages [B, T] and returns [B, T] (returns == advantages)."""
    group_size = inputs.group_size
    grouped = check_groups(inputs.rewards, inputs.mask, group_size)
    if group_size == 1:
        per_sample = torch.zeros(grouped.numel(), dtype=grouped.dtype, device=grouped.device)
    else:
        others = (grouped.sum(dim=-1, keepdim=True) - grouped) / (group_size - 1)
        per_sample = (grouped - others).reshape(-1)
    adv = broadcast_to_tokens(per_sample, inputs.mask.float())
    return AdvantageOutputs(adv, adv.clone())

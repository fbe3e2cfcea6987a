"""Sequence packing: many samples in ONE row, no padding tokens, block-diagonal attention.

Each sample contributes ``prompt_ids + response_ids[:-1]`` to the packed row (the last response token is
never an input whose output we need). ``position_ids`` restart at 0 for every sample; with no attention
mask and no KV cache, transformers (>= 5, ``masking_utils.find_packed_sequence_indices``) reads the restarts
and builds a causal mask that is block-diagonal per sample, so packed and unpacked forwards agree.

Response token ``j`` of a sample whose prompt has ``P`` tokens is predicted by the hidden state at row
position ``offset + P - 1 + j``; ``PackedBatch.gather_index`` lists those positions in sample order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch


def seq_tokens(sample) -> int:
    """Tokens a sample occupies in a packed row (prompt + response - 1; 0 when the response is empty)."""
    r = len(sample.response_ids)
    return len(sample.prompt_ids) + r - 1 if r else 0


def split_micro_batches(samples: Sequence, micro_batch_size: int,
                        max_tokens: Optional[int] = None) -> list[list[int]]:
    """Group sample indices into micro-batches, keeping the given order.

    Without ``max_tokens``: consecutive runs of up to ``micro_batch_size`` samples. With ``max_tokens``:
    consecutive samples while the packed row stays within ``max_tokens`` tokens (a single longer sample
    gets a micro-batch of its own). Samples with an empty response are left out (they have no tokens
    to score); every other index appears exactly once.
    """
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be positive (got {micro_batch_size})")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens_per_micro_batch must be positive (got {max_tokens})")
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_tokens = 0
    for i, s in enumerate(samples):
        n = seq_tokens(s)
        if n == 0:
            continue
        if max_tokens is not None:
            full = cur and cur_tokens + n > max_tokens
        else:
            full = len(cur) >= micro_batch_size
        if full:
            batches.append(cur)
            cur, cur_tokens = [], 0
        cur.append(i)
        cur_tokens += n
    if cur:
        batches.append(cur)
    return batches


@dataclass
class PackedBatch:
    """One packed row: model inputs plus where each sample's response logprobs come from."""

    indices: list[int]              # sample indices (into the caller's list) in row order
    input_ids: torch.Tensor         # [1, N] long
    position_ids: torch.Tensor      # [1, N] long, restarting at 0 per sample
    gather_index: torch.Tensor      # [R] long: row positions whose logits score the response tokens
    targets: torch.Tensor           # [R] long: the response tokens themselves
    response_lengths: list[int]     # per sample, sums to R

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device) -> "PackedBatch":
        return PackedBatch(self.indices, self.input_ids.to(device), self.position_ids.to(device),
                           self.gather_index.to(device), self.targets.to(device), self.response_lengths)


def pack(samples: Sequence, indices: list[int]) -> PackedBatch:
    """Build the packed row for ``samples[i] for i in indices`` (each must have a non-empty response)."""
    ids: list[int] = []
    pos: list[int] = []
    gather: list[int] = []
    targets: list[int] = []
    lengths: list[int] = []
    for i in indices:
        s = samples[i]
        p, r = list(s.prompt_ids), list(s.response_ids)
        if not r:
            raise ValueError(f"sample {i} (index {s.index}) has an empty response; it cannot be packed")
        if not p:
            raise ValueError(f"sample {i} (index {s.index}) has no prompt_ids; the first response token "
                             "would have nothing to condition on")
        offset = len(ids)
        seq = p + r[:-1]
        ids.extend(seq)
        pos.extend(range(len(seq)))
        gather.extend(range(offset + len(p) - 1, offset + len(seq)))
        targets.extend(r)
        lengths.append(len(r))
    return PackedBatch(
        indices=list(indices),
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        gather_index=torch.tensor(gather, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        response_lengths=lengths,
    )


def pad_stack(rows: Sequence[torch.Tensor], length: int, value: float = 0.0,
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Right-pad 1-D tensors to ``length`` and stack them into ``[len(rows), length]``."""
    dtype = dtype or (rows[0].dtype if rows else torch.float32)
    out = torch.full((len(rows), length), value, dtype=dtype,
                     device=rows[0].device if rows else None)
    for k, r in enumerate(rows):
        out[k, : r.shape[0]] = r.to(dtype)
    return out

"""Sequence packing: many samples in ONE row, no padding tokens, block-diagonal attention.

Each sample contributes ``prompt_ids + response_ids[:-1]`` to the packed row (the last response token is
never an input whose output we need). ``position_ids`` restart at 0 for every sample, and every
batch carries its :class:`~slick.train.attention.Segments` (which rows attend to which), so each sample sees
only itself (and its shared prompt): packed and unpacked forwards agree.

Response token ``j`` of a sample whose prompt has ``P`` tokens is predicted by the hidden state at row
position ``offset + P - 1 + j``; ``PackedBatch.gather_index`` lists those positions in sample order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from slick.train.attention import Segments


def seq_tokens(sample) -> int:
    """Tokens a sample occupies in a packed row (prompt + response - 1; 0 when the response is empty)."""
    r = len(sample.response_ids)
    return len(sample.prompt_ids) + r - 1 if r else 0


def split_micro_batches(samples: Sequence, micro_batch_size: int,
                        max_tokens: Optional[int] = None, shared_prompts: bool = False) -> list[list[int]]:
    """Group sample indices into micro-batches, keeping the given order.

    Without ``max_tokens``: consecutive runs of up to ``micro_batch_size`` samples. With ``max_tokens``:
    consecutive samples while the packed row stays within ``max_tokens`` tokens (a single longer sample
    gets a micro-batch of its own). ``shared_prompts``: the row is packed by :func:`pack_shared_prompts`, so
    a sample whose prompt is already in the micro-batch adds only its response's tokens. Samples with an empty
    response are left out (they have no tokens to score); every other index appears exactly once.
    """
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be positive (got {micro_batch_size})")
    if max_tokens is not None and max_tokens <= 0:
        raise ValueError(f"max_tokens_per_micro_batch must be positive (got {max_tokens})")
    batches: list[list[int]] = []
    cur: list[int] = []
    prompts: set[tuple] = set()   # the prompts in the current row (shared_prompts)
    cur_tokens = 0
    for i, s in enumerate(samples):
        n = seq_tokens(s)
        if n == 0:
            continue
        key = tuple(s.prompt_ids)
        add = n - len(key) if shared_prompts and key in prompts else n
        if max_tokens is not None:
            full = cur and cur_tokens + add > max_tokens
        else:
            full = len(cur) >= micro_batch_size
        if full:
            batches.append(cur)
            cur, cur_tokens, add = [], 0, n
            prompts.clear()
        cur.append(i)
        cur_tokens += add
        prompts.add(key)
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
    segments: Segments              # which rows attend to which (block-diagonal, or a tree for shared prompts)
    routing: Optional[torch.Tensor] = None   # [N, MoE layers, k] experts to replay per row, -1: none (train/moe.py)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def attention_mask(self) -> Optional[torch.Tensor]:
        """``[1,1,N,N]`` bool (True = attend) when samples share prompts; None for one block per sample."""
        if all(P == 0 for _, P, _, _ in self.segments.spans):
            return None
        return self.segments.dense_mask()

    def attention(self) -> tuple[torch.Tensor, Optional[Segments]]:
        """What the model gets: ``(attention_mask, slick_segments)``: the segments and their own small mask
        where that is cheaper than one dense mask, else the dense ``[1,1,N,N]`` mask and None."""
        if self.segments.worth_it():
            return self.segments.mask, self.segments
        return self.segments.dense_mask().to(self.input_ids.device), None

    def to(self, device) -> "PackedBatch":
        return PackedBatch(self.indices, self.input_ids.to(device), self.position_ids.to(device),
                           self.gather_index.to(device), self.targets.to(device), self.response_lengths,
                           self.segments.to(device), self.routing)


def pack(samples: Sequence, indices: list[int]) -> PackedBatch:
    """Build the packed row for ``samples[i] for i in indices`` (each must have a non-empty response)."""
    ids: list[int] = []
    pos: list[int] = []
    gather: list[int] = []
    targets: list[int] = []
    lengths: list[int] = []
    spans: list[tuple[int, int, int, int]] = []
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
        spans.append((offset, 0, offset, offset + len(seq)))
        ids.extend(seq)
        pos.extend(range(len(seq)))
        gather.extend(range(offset + len(p) - 1, offset + len(seq)))
        targets.extend(r)
        lengths.append(len(r))
    return _packed(indices, ids, pos, gather, targets, lengths, spans)


def _packed(indices, ids, pos, gather, targets, lengths, spans) -> PackedBatch:
    return PackedBatch(
        indices=list(indices),
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        gather_index=torch.tensor(gather, dtype=torch.long),
        targets=torch.tensor(targets, dtype=torch.long),
        response_lengths=lengths,
        segments=Segments.build(spans, len(ids)),
    )


def pack_shared_prompts(samples: Sequence, indices: list[int]) -> PackedBatch:
    """Like :func:`pack`, but samples with identical ``prompt_ids`` share ONE copy of their prompt.

    Row layout per prompt group: ``prompt, resp_1[:-1], resp_2[:-1], ...``; each response segment sits at
    the positions that follow the prompt and attends to the prompt and to itself only (a tree-shaped mask),
    so every logprob and gradient equals that of separate sequences while the prompt is computed once per
    group instead of once per sample (GRPO's n samples per prompt). Outputs keep the order of ``indices``.
    """
    groups: dict[tuple, list[int]] = {}
    for i in indices:
        s = samples[i]
        if not s.response_ids or not s.prompt_ids:
            raise ValueError(f"sample {i} (index {s.index}) needs a prompt and a non-empty response to be packed")
        groups.setdefault(tuple(s.prompt_ids), []).append(i)
    ids: list[int] = []
    pos: list[int] = []
    spans: list[tuple[int, int, int, int]] = []   # (prompt start, prompt length seen, start, end) per row span
    where: dict[int, list[int]] = {}             # sample index -> row positions scoring its response tokens
    for prompt, members in groups.items():
        p0, P = len(ids), len(prompt)
        ids.extend(prompt)
        pos.extend(range(P))
        spans.append((p0, 0, p0, p0 + P))
        for i in members:
            r = list(samples[i].response_ids)
            s0 = len(ids)
            ids.extend(r[:-1])
            pos.extend(range(P, P + len(r) - 1))
            spans.append((p0, P, s0, len(ids)))
            where[i] = [p0 + P - 1] + list(range(s0, len(ids)))
    gather = [g for i in indices for g in where[i]]
    targets = [t for i in indices for t in samples[i].response_ids]
    lengths = [len(samples[i].response_ids) for i in indices]
    return _packed(indices, ids, pos, gather, targets, lengths, spans)


def shares_prompts(samples: Sequence, indices: list[int]) -> bool:
    """True when at least two of the samples have the same prompt (sharing would save tokens)."""
    seen = set()
    for i in indices:
        key = tuple(samples[i].prompt_ids)
        if key in seen:
            return True
        seen.add(key)
    return False


def pad_stack(rows: Sequence[torch.Tensor], length: int, value: float = 0.0,
              dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Right-pad 1-D tensors to ``length`` and stack them into ``[len(rows), length]``."""
    dtype = dtype or (rows[0].dtype if rows else torch.float32)
    out = torch.full((len(rows), length), value, dtype=dtype,
                     device=rows[0].device if rows else None)
    for k, r in enumerate(rows):
        out[k, : r.shape[0]] = r.to(dtype)
    return out

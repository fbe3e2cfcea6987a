"""A typed training batch: the columns one rollout step trains on, sliced together.

Built once after scoring (:meth:`TrainBatch.from_samples`: the samples and their scalar rewards); the loop then
adds columns as they are computed (old/ref logprobs, critic values, advantages, returns) with
:meth:`TrainBatch.with_columns`, and the optimizer steps take consecutive slices (:meth:`TrainBatch.slice`).
Every column holds one entry per sample: a scalar (``rewards``, ``versions``), a per-token list (``tokens``,
``loss_mask``) or a 1-D per-token tensor of the response's length (logprobs, values, advantages, returns).
A column not computed for this run is ``None``. A new column (e.g. adapter ids) is a new field: slicing and
the length check iterate :func:`dataclasses.fields`, so no field can be left out of them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch


@dataclass(frozen=True)
class TrainBatch:
    """One rollout step's training data, one entry per sample in every column (``None``: not computed)."""

    samples: list                                 # the scored samples (slick.types.Sample), in training order
    rewards: list                                 # scalar reward per sample (scalarised once, after scoring)
    tokens: list                                  # response token ids per sample
    loss_mask: list                               # per response token: 1 trained, 0 not (tool output)
    versions: Optional[list] = None               # the trainer's version at the sample's optimizer step
    advantages: Optional[list] = None             # per-token advantages (the algorithm's estimator)
    returns: Optional[list] = None                # per-token critic targets (PPO)
    old_logprobs: Optional[list] = None           # per-token logprobs of the policy that is being updated
    ref_logprobs: Optional[list] = None           # per-token logprobs of the reference model (KL)
    teacher_logprobs: Optional[list] = None       # per-token logprobs of a teacher (distillation)
    values: Optional[list] = None                 # per-token critic values (PPO)

    def __post_init__(self):
        n = len(self.samples)
        for f in dataclasses.fields(self):
            col = getattr(self, f.name)
            if col is not None and len(col) != n:
                raise ValueError(f"TrainBatch: column {f.name!r} has {len(col)} entries for {n} samples")

    @classmethod
    def from_samples(cls, samples: Sequence, rewards: Sequence, versions: Optional[Sequence] = None,
                     **columns: Any) -> "TrainBatch":
        """The batch of ``samples`` with their scalar ``rewards`` (and optional ``versions`` and other columns)."""
        samples = list(samples)
        return cls(samples=samples, rewards=[float(r) for r in rewards],
                   tokens=[list(s.response_ids) for s in samples], loss_mask=[sample_loss_mask(s) for s in samples],
                   versions=None if versions is None else list(versions),
                   **{k: None if v is None else list(v) for k, v in columns.items()})

    def __len__(self) -> int:
        return len(self.samples)

    def with_columns(self, **columns: Any) -> "TrainBatch":
        """A copy with ``columns`` set (each one entry per sample, or None); unknown names raise TypeError."""
        return dataclasses.replace(self, **{k: None if v is None else list(v) for k, v in columns.items()})

    def slice(self, start: int, stop: int) -> "TrainBatch":
        """Samples ``start:stop`` with every column cut alike."""
        return self._map(lambda col: col[start:stop])

    def select(self, indices: Sequence[int]) -> "TrainBatch":
        """The samples at ``indices`` (in that order) with every column picked alike."""
        indices = list(indices)
        return self._map(lambda col: [col[i] for i in indices])

    def _map(self, cut) -> "TrainBatch":
        return TrainBatch(**{f.name: None if getattr(self, f.name) is None else cut(getattr(self, f.name))
                             for f in dataclasses.fields(self)})

    def response_lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def padded(self, name: str) -> torch.Tensor:
        """Column ``name`` as one float32 ``[len(batch), longest response]`` tensor, zero-padded on the right."""
        col = getattr(self, name)
        if col is None:
            raise ValueError(f"TrainBatch: column {name!r} was not computed for this batch")
        return pad(col, max(self.response_lengths() + [1]))


def sample_loss_mask(sample) -> list[int]:
    """``sample``'s loss mask, one entry per response token (none given: every token trains); a ValueError naming
    the sample when the lengths differ."""
    m = list(sample.loss_mask) if sample.loss_mask else [1] * len(sample.response_ids)
    if len(m) != len(sample.response_ids):
        raise ValueError(f"sample index {sample.index}: loss_mask has {len(m)} entries but the response has "
                         f"{len(sample.response_ids)} tokens")
    return m


def pad(rows: Sequence, width: int) -> torch.Tensor:
    """Per-sample rows (lists or tensors of any length up to ``width``) as one float32 ``[len(rows), width]``
    tensor, zero-padded on the right."""
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, r in enumerate(rows):
        r = torch.as_tensor(r, dtype=torch.float32)
        out[i, : len(r)] = r
    return out

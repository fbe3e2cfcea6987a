"""DataSource: hands out prompts as groups of Samples, epoch after epoch, and can resume exactly.

The cursor is (epoch, offset into that epoch's order). Each epoch's order is the identity, or,
with ``shuffle``, a permutation seeded by (seed, epoch) alone, so a resumed run recomputes the
same order. Group and sample indices keep increasing across epochs and across resumes.
Groups given back with ``put_back`` (e.g. aborted partial rollouts) are handed out again first.
"""
from __future__ import annotations

import copy
import logging
import math
import random
import threading
from typing import Sequence

from slick.config import Config
from slick.types import Sample

logger = logging.getLogger(__name__)


def epoch_order(n: int, epoch: int, shuffle: bool, seed: int) -> list[int]:
    """Order of the dataset rows in ``epoch``: identity, or a permutation seeded by (seed, epoch)."""
    order = list(range(n))
    if shuffle:
        random.Random(f"slick-data:{seed}:{epoch}").shuffle(order)
    return order


class DataSource:
    """Turns a dataset (a sequence of row dicts with ``prompt_ids``) into groups of ``n`` Samples.

    ``dataset`` is usually a ``PromptDataset``; any sequence of dicts with keys ``prompt``,
    ``prompt_ids`` and optionally ``label``, ``metadata``, ``tools``, ``prompt_index`` works.
    """

    def __init__(self, dataset: Sequence[dict], n_samples_per_prompt: int, shuffle: bool = False, seed: int = 42):
        if len(dataset) == 0:
            raise ValueError("DataSource needs a non-empty dataset")
        if n_samples_per_prompt <= 0:
            raise ValueError(f"n_samples_per_prompt must be positive (got {n_samples_per_prompt})")
        self.dataset = dataset
        self.n_samples_per_prompt = int(n_samples_per_prompt)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.offset = 0            # position in the current epoch's order
        self.consumed = 0          # prompts handed out from the dataset (put-back groups not counted)
        self.next_group_index = 0
        self.next_sample_index = 0
        self._pending: list[list[Sample]] = []
        self._order = epoch_order(len(dataset), 0, self.shuffle, self.seed)
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, dataset: Sequence[dict], cfg: Config) -> "DataSource":
        """Build from a ``slick.config.Config`` (--n-samples-per-prompt, --rollout-shuffle, --rollout-seed)."""
        return cls(dataset, cfg.n_samples_per_prompt, shuffle=cfg.rollout_shuffle, seed=cfg.rollout_seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def _make_group(self, row: dict, row_pos: int) -> list[Sample]:
        group = []
        for _ in range(self.n_samples_per_prompt):
            group.append(Sample(
                index=self.next_sample_index, group_index=self.next_group_index,
                prompt_index=int(row.get("prompt_index", row_pos)), epoch=self.epoch,
                prompt=copy.deepcopy(row["prompt"]), label=copy.deepcopy(row.get("label")),
                metadata=copy.deepcopy(row.get("metadata") or {}), tools=copy.deepcopy(row.get("tools")),
                prompt_ids=list(row["prompt_ids"])))
            self.next_sample_index += 1
        self.next_group_index += 1
        return group

    def get_groups(self, num_groups: int) -> list[list[Sample]]:
        """Next ``num_groups`` groups: put-back groups first, then fresh prompts, wrapping into new epochs."""
        if num_groups < 0:
            raise ValueError(f"num_groups must be >= 0 (got {num_groups})")
        with self._lock:
            out = self._pending[:num_groups]
            del self._pending[:num_groups]
            while len(out) < num_groups:
                if self.offset >= len(self.dataset):
                    self.epoch += 1
                    self.offset = 0
                    self._order = epoch_order(len(self.dataset), self.epoch, self.shuffle, self.seed)
                pos = self._order[self.offset]
                out.append(self._make_group(self.dataset[pos], pos))
                self.offset += 1
                self.consumed += 1
            return out

    def put_back(self, groups: list[list[Sample]]) -> None:
        """Return groups (e.g. aborted ones) to be handed out again, before any fresh prompt."""
        with self._lock:
            self._pending = [list(g) for g in groups] + self._pending

    def num_steps(self, rollout_batch_size: int, num_epoch: int = 1) -> int:
        """Rollout steps needed to cover ``num_epoch`` passes: ceil(len * num_epoch / rollout_batch_size)."""
        if rollout_batch_size <= 0:
            raise ValueError(f"rollout_batch_size must be positive (got {rollout_batch_size})")
        return math.ceil(len(self.dataset) * num_epoch / rollout_batch_size)

    def state_dict(self) -> dict:
        """JSON-serialisable cursor (plus any put-back groups)."""
        with self._lock:
            return {"epoch": self.epoch, "offset": self.offset, "consumed": self.consumed,
                    "next_group_index": self.next_group_index, "next_sample_index": self.next_sample_index,
                    "shuffle": self.shuffle, "seed": self.seed, "dataset_len": len(self.dataset),
                    "n_samples_per_prompt": self.n_samples_per_prompt,
                    "pending": [[s.to_dict() for s in g] for g in self._pending]}

    def load_state_dict(self, state: dict) -> None:
        """Restore a cursor saved by ``state_dict``; the next group is the one that would have come next."""
        with self._lock:
            if state.get("dataset_len", len(self.dataset)) != len(self.dataset):
                logger.warning("DataSource: resuming on a dataset of %d prompts, saved with %s; "
                               "the order will differ", len(self.dataset), state["dataset_len"])
            if state.get("shuffle", self.shuffle) != self.shuffle or state.get("seed", self.seed) != self.seed:
                logger.warning("DataSource: shuffle/seed differ from the saved run (%s/%s vs %s/%s)",
                               state.get("shuffle"), state.get("seed"), self.shuffle, self.seed)
            self.epoch = int(state["epoch"])
            self.offset = min(int(state["offset"]), len(self.dataset))
            self.consumed = int(state["consumed"])
            self.next_group_index = int(state["next_group_index"])
            self.next_sample_index = int(state["next_sample_index"])
            self._pending = [[Sample.from_dict(d) for d in g] for g in state.get("pending", [])]
            self._order = epoch_order(len(self.dataset), self.epoch, self.shuffle, self.seed)

    def __repr__(self) -> str:
        return (f"DataSource(prompts={len(self.dataset)}, n={self.n_samples_per_prompt}, epoch={self.epoch}, "
                f"offset={self.offset}, consumed={self.consumed})")


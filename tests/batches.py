"""TrainBatches for tests that drive a trainer directly (the loop builds them from scored samples)."""
from __future__ import annotations

from slick.algo.batch import TrainBatch


def batch_of(samples, advantages=None, **columns) -> TrainBatch:
    """``samples`` (rewards 0, which a trainer does not read) with ``advantages`` and any other columns."""
    return TrainBatch.from_samples(samples, [0.0] * len(samples), advantages=advantages, **columns)


def value_batch(samples, returns, values) -> TrainBatch:
    """What a value head trains on: the ``returns`` it regresses on around the rollout's ``values``."""
    return TrainBatch.from_samples(samples, [0.0] * len(samples), returns=returns, values=values)

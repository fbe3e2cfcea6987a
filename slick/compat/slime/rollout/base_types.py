"""slime's rollout-function results: ``RolloutFnTrainOutput(samples, metrics)`` and
``RolloutFnEvalOutput(data, metrics)``, and ``call_rollout_fn``, which wraps a legacy function's bare result in
them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from slick.compat.slime.utils.types import Sample


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: Optional[dict[str, Any]] = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: Optional[dict[str, Any]] = None


def call_rollout_fn(fn, *args, evaluation: bool, **kwargs):
    out = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(out, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return out
    return RolloutFnEvalOutput(data=out) if evaluation else RolloutFnTrainOutput(samples=out)

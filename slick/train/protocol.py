"""The trainer protocol: what the loop calls on a trainer, whichever implementation it got.

Beside the engine protocol (``slick.engine.base.Engine``): the loop (``slick.loop``) talks to a trainer only
through :class:`Trainer`. Implementations: the in-process :class:`slick.train.trainer.Trainer` (and PPO's
:class:`slick.train.critic.Critic`, which is one), and :class:`slick.cluster.trainer_group.RayTrainerGroup`
(trainer ranks as Ray actors). The loop never asks which one it has.

Weights reach the engines through :meth:`Trainer.send_weights` and a :class:`WeightSink` (the run's engines
and its weight transport, ``slick.loop.weights.EngineWeights``): the in-process trainer hands its weights to
the sink, which sends them from this process; the Ray group has its ranks push them themselves when the
sink's engines are theirs to reach (``ranks_reach_engines``), and otherwise hands the gathered weights to the
sink like the in-process trainer.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional, Protocol, Sequence, runtime_checkable

from slick.algo.batch import TrainBatch


@runtime_checkable
class WeightSink(Protocol):
    """Where a trainer's weights go: the run's engines through one weight transport."""

    transport: str               # "disk", "broadcast" or "colocated" (--weight-transport, resolved)
    ranks_reach_engines: bool    # the engines are Ray actors the trainer's ranks push weights to themselves
    worker_urls: list            # the engine servers (their URLs), when they are servers
    disk_dir: str                # the disk transport's directory
    bucket_bytes: int            # --weight-bucket-mb, in bytes

    async def send(self, source: Any) -> float:
        """Send ``source.named_weights()`` as version ``source.version`` from this process; returns seconds."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """A policy trainer as the loop sees it. Every method is collective over the trainer's ranks, if any."""

    version: int                 # optimizer steps taken (the weight version the engines get)
    skipped_steps: int           # optimizer steps skipped for a non-finite loss or gradient norm
    work: Optional[tuple]        # (pass, micro-batches done, of how many) while one runs, or None (progress lines)
    has_ref: bool                # a frozen reference model is loaded (KL terms)
    device: Any                  # torch.device the trainer computes on
    dtype: Any                   # torch dtype the trainer computes in

    def train_step(self, batch: TrainBatch, objective: Any) -> dict:
        """One optimizer step over ``batch`` (the loop's only contract with a trainer); prefix-free float
        metrics. ``objective(LossInputs) -> (loss, metrics)``."""
        ...

    def compute_logprobs(self, samples: Sequence, which: str = "actor") -> list:
        """Per sample, the logprob of each response token under the actor or the reference model."""
        ...

    def candidate_logprobs(self, token_ids: Sequence[int], candidates: Sequence) -> Optional[list]:
        """The actor's T=1 logprobs ``[{token: logprob}]`` of ``candidates[i]`` at position i+1 of ``token_ids`` (the
        mismatch probe, slick/loop/mismatch.py); None when this trainer does not offer it (ranks on Ray)."""
        ...

    def named_weights(self) -> Iterator:
        """(HF parameter name, tensor) for every parameter."""
        ...

    async def send_weights(self, sink: WeightSink) -> float:
        """Push the current weights (version :attr:`version`) to ``sink``'s engines; returns the seconds."""
        ...

    def save(self, out_dir: Any) -> None:
        """Model, optimizer, scheduler, RNG states and version into ``out_dir``."""
        ...

    def load(self, in_dir: Any) -> None:
        """Restore what :meth:`save` wrote."""
        ...

    def save_hf_files(self, out_dir: Any) -> None:
        """A loadable Hugging Face model directory of the current weights."""
        ...

    def close(self) -> None:
        """Release what the trainer started (ranks, process groups); idempotent."""
        ...

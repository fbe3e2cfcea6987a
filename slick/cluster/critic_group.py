"""PPO's critic on Ray: one :class:`slick.train.critic.Critic` inside each trainer rank's actor.

The critic is placed exactly like the trainer: every trainer rank (``slick.cluster.trainer_group.TrainerRank``)
builds its critic beside its Trainer when the run needs one, in the same process, on the same bundle (GPU or CPU
slot) and in the same torch.distributed group, so with several ranks the critic is FSDP2-sharded over them like
the policy. That is slime's colocated critic; a critic on slots of its own is not offered (the layout has no
``--critic-num-gpus-per-node``). :class:`RayCriticGroup` fans the critic's methods out through the trainer group
(same timeouts, same per-rank error naming) and is seen by the loop as one in-process Critic.
"""
from __future__ import annotations

from typing import Sequence

from slick.algo.batch import TrainBatch


class RayCriticGroup:
    """The critics of a :class:`slick.cluster.trainer_group.RayTrainerGroup`'s ranks, as one Critic."""

    remote = True

    def __init__(self, trainers):
        if not getattr(trainers, "actors", None):
            raise RuntimeError("RayCriticGroup needs a started RayTrainerGroup (its ranks host the critics)")
        self.trainers = trainers
        self.version = 0

    def _call(self, method: str, *args, what: str, **kwargs):
        return self.trainers._fanout(f"critic.{method}", *args, what=f"{what} (critic)", **kwargs)

    def compute_values(self, samples: Sequence):
        return self._call("compute_values", list(samples), what="compute values")

    def train_step(self, batch: TrainBatch, objective) -> dict:
        """The trainer's signature: the value head reads the batch's ``returns`` and ``values``
        (``slick.train.critic.Critic``)."""
        out = self._call("train_step", batch, objective, what="train the critic")
        self.version += int(out["skipped_steps"] == 0)
        return out

    def save(self, out_dir) -> None:
        self._call("save", str(out_dir), what=f"save the critic into {out_dir}")

    def load(self, in_dir) -> None:
        self._call("load", str(in_dir), what=f"load the critic from {in_dir}")
        self.version = int(self._call("__getattribute__", "version", what="read the critic's version"))

    def close(self) -> None:
        """Nothing of its own: the trainer group's actors end with the trainer."""

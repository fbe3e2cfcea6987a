"""Build the trainer a config asks for: the in-process Trainer, or trainer ranks as Ray actors; and the critic.

``make_trainer(cfg, cluster)`` sits beside ``slick.factory.engines.make_engines``: the loop sees one trainer
interface (``version``, ``has_ref``, ``device``, ``skipped_steps``, ``compute_logprobs``, ``train_step``,
``named_weights``, ``save``, ``load``, ``save_hf_files``) whichever it gets.
"""
from __future__ import annotations

from slick.cluster.critic_group import RayCriticGroup
from slick.cluster.trainer_group import RayTrainerGroup
from slick.config import Config
from slick.train.critic import Critic, needs_critic
from slick.train.trainer import Trainer


def make_trainer(cfg: Config, cluster=None, thread_budget=None):
    """``Trainer(cfg, thread_budget=...)`` in this process, or a :class:`slick.cluster.trainer_group.RayTrainerGroup` of
    ``--actor-num-nodes`` x ``--actor-num-gpus-per-node`` ranks on ``cluster``'s placement group (every remote
    call bounded by --dist-timeout, start-up by --ray-start-timeout; the layout sets each rank's threads, so
    ``thread_budget`` is for the in-process trainer only)."""
    if cluster is None or cluster.layout is None:
        return Trainer(cfg, thread_budget=thread_budget)
    return RayTrainerGroup(cfg, cluster, timeout_s=float(cfg.dist_timeout),
                           start_timeout_s=float(cfg.ray_start_timeout))


def make_critic(cfg: Config, cluster=None, trainer=None):
    """The run's critic, or None when the estimator needs none: ``Critic(cfg)`` in this process, or, when the
    trainer runs as Ray ranks, a :class:`slick.cluster.critic_group.RayCriticGroup` (one critic inside each
    trainer rank's actor: placed exactly like the trainer, same FSDP ranks)."""
    if not needs_critic(cfg):
        return None
    if getattr(trainer, "remote", False):
        return RayCriticGroup(trainer)
    return Critic(cfg)

"""Build the trainer a config asks for: the in-process Trainer, or trainer ranks as Ray actors.

``make_trainer(cfg, cluster)`` sits beside ``slick.engine.factory.make_engines``: the loop sees one trainer
interface (``version``, ``has_ref``, ``device``, ``skipped_steps``, ``compute_logprobs``, ``train_step``,
``named_weights``, ``save``, ``load``, ``save_hf_files``) whichever it gets.
"""
from __future__ import annotations


def make_trainer(cfg, cluster=None):
    """``Trainer(cfg)`` in this process, or a :class:`slick.cluster.trainer_group.RayTrainerGroup` of
    ``--actor-num-nodes`` x ``--actor-num-gpus-per-node`` ranks on ``cluster``'s placement group (every remote
    call bounded by --dist-timeout, start-up by --ray-start-timeout)."""
    if cluster is None or cluster.layout is None:
        from slick.train.trainer import Trainer

        return Trainer(cfg)
    from slick.cluster.trainer_group import RayTrainerGroup

    return RayTrainerGroup(cfg, cluster, timeout_s=float(cfg.dist_timeout),
                           start_timeout_s=float(cfg.ray_start_timeout))

"""The SFT "rollout": chats become training samples, no engine involved.

Supervised fine-tuning runs through the same loop as RL (``slick.loop``): each step takes
--rollout-batch-size chats from the run's DataSource (epochs, shuffling and resume as for prompts), and this
rollout fills every sample with the chat's tokens and loss mask, computed once when the data was loaded
(``slick.data.chats``, ``slick.chat.turns``). The samples are then trained with the SFT loss
(``slick.algo.sft``). Selected by ``--loss-type sft_loss`` (``slick sft`` sets it); ``--rollout-function-path
slick.rollout.sft.generate_rollout`` or slime's ``slime.rollout.sft_rollout.generate_rollout`` name it too.
"""
from __future__ import annotations

from typing import Mapping

from slick.config import Config
from slick.types import Status


class SftRollout:
    """``await rollout(cfg, manager, step) -> (groups, metrics)``, the signature of --rollout-function-path.

    ``source`` hands out groups of one sample per chat (its rows: ``slick.data.chats.ChatDataset``); ``rows``
    maps a row's ``prompt_index`` to the row (its ``response_ids`` and ``loss_mask``). ``manager`` is unused:
    SFT starts no engine."""

    def __init__(self, source, rows: Mapping[int, dict], tokenizer=None):
        self.source, self.rows, self.tok = source, rows, tokenizer

    async def __call__(self, cfg: Config, manager, step: int):
        groups = self.source.get_groups(cfg.rollout_batch_size)
        trained = total = 0
        for group in groups:
            for s in group:
                fill_sample(s, self.rows[s.prompt_index], self.tok)
                trained += sum(s.loss_mask)
                total += len(s.prompt_ids) + len(s.response_ids)
        n = max(sum(len(g) for g in groups), 1)
        return groups, {"rollout/sft_trained_tokens": float(trained), "rollout/sft_tokens": float(total),
                        "rollout/response_len/mean": sum(len(s.response_ids) for g in groups for s in g) / n,
                        "rollout/epoch": float(max((s.epoch for g in groups for s in g), default=0))}


def fill_sample(sample, row: dict, tokenizer=None) -> None:
    """``sample`` (made from ``row``'s prompt) with the row's response tokens and mask, complete and reward 0."""
    sample.response_ids = list(row["response_ids"])
    sample.loss_mask = list(row["loss_mask"])
    sample.rollout_logprobs = []
    sample.weight_versions = []
    sample.reward = 0.0
    sample.status = Status.COMPLETED
    if tokenizer is not None:
        sample.response = tokenizer.decode(sample.response_ids, skip_special_tokens=False)


async def generate_rollout(cfg: Config, manager, step: int):
    """The name ``--rollout-function-path`` gives the SFT rollout; the run builds :class:`SftRollout` for it."""
    raise RuntimeError("slick.rollout.sft.generate_rollout selects the SFT rollout, which the run builds with its "
                       "chat data; run with --loss-type sft_loss (or slick sft)")

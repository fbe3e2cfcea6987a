"""The inputs of an SFT run and its held-out evaluation; the teacher check of on-policy distillation.

``sft_inputs(cfg, tok)`` gives the rollout inputs of a run (``slick.loop.parts.RolloutParts``) for --loss-type
sft_loss: the chat dataset behind the run's DataSource (groups of one), the held-out chats of --eval-prompt-data,
and the SFT rollout (``slick.rollout.sft.SftRollout``) as the run's rollout function. ``evaluate_sft`` is the eval
phase of such a run: loss, perplexity and token accuracy of the assistant tokens of each held-out set.
"""
from __future__ import annotations

import logging

from slick.algo.sft import sft_eval_metrics
from slick.config import Config, ConfigError
from slick.data.chats import ChatDataset
from slick.data.checks import model_context
from slick.data.source import DataSource
from slick.rollout.sft import SftRollout, fill_sample
from slick.train.sft_eval import sft_token_stats
from slick.train.teacher import TokenizerMismatch, check_same_tokenizer
from slick.types import Sample

log = logging.getLogger("slick")


def sft_inputs(cfg: Config, tok) -> tuple[DataSource, dict[str, ChatDataset], SftRollout]:
    """(the chats' DataSource, the held-out chat sets by name, the SFT rollout) of an SFT run. Every chat is
    checked and tokenized here, before the trainer loads: a bad row stops the run naming its file and line."""
    found = model_context(cfg)
    max_len, source = found if found is not None else (None, "")
    chats = ChatDataset.from_config(cfg, tok, max_len=max_len, max_len_source=source)
    data = DataSource(chats, 1, shuffle=cfg.rollout_shuffle, seed=cfg.rollout_seed)
    pairs = list(cfg.eval_prompt_data)
    eval_sets = {n: ChatDataset.from_config(cfg, tok, spec=p, max_len=max_len, max_len_source=source)
                 for n, p in zip(pairs[::2], pairs[1::2])}
    return data, eval_sets, SftRollout(data, chats.row_at, tok)


def check_teacher(cfg: Config) -> None:
    """--use-opd: the teacher shares the student's tokenizer, else ConfigError naming both directories. A teacher
    at --opd-teacher-url alone is not checked (its tokenizer files are not here): a warning says so."""
    if cfg.use_opd and not cfg.opd_teacher_load:
        log.warning("--opd-teacher-url %s without --opd-teacher-load: the teacher's tokenizer cannot be checked "
                    "against the student's; give --opd-teacher-load a local copy of the teacher to check it",
                    cfg.opd_teacher_url)
    elif cfg.use_opd:
        try:
            check_same_tokenizer(cfg.hf_checkpoint, cfg.opd_teacher_load)
        except TokenizerMismatch as e:
            raise ConfigError([str(e)]) from None


def evaluate_sft(trainer, eval_sets: dict) -> dict:
    """``eval/<name>/loss``, ``/ppl``, ``/token_acc`` (when the trainer's model is in this process) and
    ``/tokens`` over the assistant tokens of every held-out chat set."""
    out = {}
    for name, ds in eval_sets.items():
        samples = []
        for i, row in enumerate(ds):
            s = Sample(index=i, prompt_index=row["prompt_index"], prompt=row["prompt"],
                       prompt_ids=list(row["prompt_ids"]))
            fill_sample(s, row)
            samples.append(s)
        logprobs, correct = sft_token_stats(trainer, samples)
        metrics = sft_eval_metrics(logprobs, correct, [s.loss_mask for s in samples])
        out.update({f"eval/{name}/{k}": v for k, v in metrics.items()})
    return out

"""Start-up checks of a run's inputs, before any model loads or any step runs.

* :func:`check_prompt_lengths`: every prompt (tokenized after the chat template) plus the response budget
  (--rollout-max-response-len, or --eval-max-response-len for eval sets) must fit the model's context;
  otherwise a ``DataError`` names the file, line (or row) and the lengths of the first offending rows. The
  datasets are tokenized at load already, so the check only compares numbers.
* :func:`check_zero_advantages`: a group-relative advantage estimator (grpo, gspo, rloo,
  reinforce_plus_plus_baseline) with --n-samples-per-prompt 1 gives every sample an advantage of exactly 0:
  the policy-gradient loss is 0 and the run would only move the model through its KL/entropy terms. Refused
  unless --allow-zero-advantages (then a warning says so). The estimator is asked, not looked up in a list:
  it runs once on a tiny batch of groups of one with different rewards, so new estimators are covered.
"""
from __future__ import annotations

import logging
from typing import Mapping, Optional

from slick.algo.estimators import get_estimator
from slick.algo.inputs import AdvantageInputs
from slick.algo.params import AlgoParams
from slick.config import Config, ConfigError
from slick.data.dataset import DataError
from slick.models.check import read_model_config

log = logging.getLogger("slick")

SHOW = 5   # offending rows named in the error


def model_context(cfg: Config) -> Optional[tuple[int, str]]:
    """(context tokens, where that number comes from) for the run's model, or None when unknown.

    The model's ``max_position_embeddings`` (``config.json`` of --hf-checkpoint); for engines slick starts
    itself, also its sliding window when the engine uses one and ``--sglang-context-length``."""
    if not cfg.hf_checkpoint:
        return None
    try:
        c = read_model_config(cfg.hf_checkpoint)
    except (OSError, ValueError):
        return None            # the model loader reports a missing or bad config.json
    if not c.get("max_position_embeddings"):
        return None
    limits = [(int(c["max_position_embeddings"]), f"max_position_embeddings in {cfg.hf_checkpoint}/config.json")]
    if not cfg.rollout_urls:       # engines slick launches: LocalEngine's own limits
        sw = c.get("sliding_window")
        if sw and (c.get("model_type") == "mistral" or c.get("use_sliding_window")):
            limits.append((int(sw), f"sliding_window in {cfg.hf_checkpoint}/config.json"))
        ctx = (cfg.sglang or {}).get("context_length")
        if ctx is not None and str(ctx).strip().isdigit():
            limits.append((int(ctx), "--sglang-context-length"))
    return min(limits)


def check_prompt_lengths(dataset, context: int, source: str, budget: int, budget_flag: str) -> None:
    """Raise ``DataError`` when some prompt of ``dataset`` (a ``PromptDataset``) plus ``budget`` new tokens
    exceeds ``context``, naming the first offending rows by file and line with their lengths."""
    limit = context - budget
    bad = [i for i, row in enumerate(dataset.rows) if len(row["prompt_ids"]) > limit]
    if not bad:
        return
    where = getattr(dataset, "where", None)
    shown = "; ".join(f"{where[i] if where else f'{dataset.path} row {i + 1}'}: "
                      f"{len(dataset.rows[i]['prompt_ids'])} prompt tokens" for i in bad[:SHOW])
    more = f" (and {len(bad) - SHOW} more)" if len(bad) > SHOW else ""
    fix = (f"pass --rollout-max-prompt-len {limit} to drop them, or lower {budget_flag}" if limit > 0
           else f"lower {budget_flag}")
    raise DataError(f"{len(bad)} of {len(dataset.rows)} prompts do not fit the context: prompt + {budget_flag} "
                    f"{budget} > {context} tokens ({source}): {shown}{more}. Prompts are counted after the chat "
                    f"template; {fix}")


def check_run_prompts(cfg: Config, train_set, eval_sets: Mapping[str, object]) -> None:
    """:func:`check_prompt_lengths` for the training set (--rollout-max-response-len) and every eval set
    (--eval-max-response-len, default --rollout-max-response-len). No-op when the context is unknown."""
    found = model_context(cfg)
    if found is None:
        return
    context, source = found
    if train_set is not None:
        check_prompt_lengths(train_set, context, source, cfg.rollout_max_response_len, "--rollout-max-response-len")
    budget, flag = cfg.rollout_max_response_len, "--rollout-max-response-len"
    if cfg.eval_max_response_len is not None:
        budget, flag = cfg.eval_max_response_len, "--eval-max-response-len"
    for ds in eval_sets.values():
        check_prompt_lengths(ds, context, source, budget, flag)


def always_zero_advantages(cfg: Config) -> bool:
    """Whether the run's built-in estimator gives advantage 0 to every sample at the run's group size:
    it is run on groups of ``--n-samples-per-prompt`` samples with rewards that all differ (and logprobs whose
    KL differs from 0). A custom estimator (--custom-advantage-function-path) is not run: False."""
    import torch

    if cfg.custom_advantage_function_path:
        return False
    n = int(cfg.n_samples_per_prompt)
    b, t = 3 * n, 4
    mask = torch.ones(b, t)
    g = torch.Generator().manual_seed(0)
    inputs = AdvantageInputs(rewards=torch.arange(b, dtype=torch.float32) * 0.7 + 0.3, mask=mask, group_size=n,
                             cfg=AlgoParams.from_config(cfg), old_logprobs=-torch.rand(b, t, generator=g),
                             ref_logprobs=-torch.rand(b, t, generator=g), values=torch.zeros(b, t))
    try:
        out = get_estimator(cfg.advantage_estimator)(inputs)
    except Exception as e:     # the probe must never be what stops a run: the first step reports real errors
        log.debug("zero-advantage probe of %s failed: %s", cfg.advantage_estimator, e)
        return False
    return bool(torch.count_nonzero(out.advantages) == 0)


def check_zero_advantages(cfg: Config) -> None:
    """Refuse (``ConfigError`` naming the flags) a training run whose every advantage is 0; with
    --allow-zero-advantages, warn instead. Runs that train nothing (--debug-rollout-only) pass."""
    if cfg.debug_rollout_only or not always_zero_advantages(cfg):
        return
    msg = (f"--advantage-estimator {cfg.advantage_estimator} with --n-samples-per-prompt "
           f"{cfg.n_samples_per_prompt}: every advantage will be 0 (a group of one sample has no other sample to "
           f"be compared with), so the policy-gradient loss is 0 and the policy learns nothing from the rewards; "
           f"use --n-samples-per-prompt 2 or more, or an estimator without a group baseline (ppo, "
           f"reinforce_plus_plus)")
    if cfg.allow_zero_advantages:
        log.warning("%s (--allow-zero-advantages: training anyway)", msg)
        return
    raise ConfigError([f"{msg}; --allow-zero-advantages runs it anyway"])

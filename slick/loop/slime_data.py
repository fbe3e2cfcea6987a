"""slime's train-data hooks, called with slime's arguments at the equivalent points of slick's training phase.

- ``--custom-convert-samples-to-train-data-path``: ``fn(args, samples) -> dict`` on each training step's samples
  (slime ``Sample``s, flat, in batch order, their rewards set), where slime turns samples into its train-data
  dict; it takes the place of slime's reward post-process and GRPO normalisation (the config implies
  ``--disable-rewards-normalization``). slick reads back, one entry per sample: ``rewards`` (the scalars the
  advantage estimator gets: with ``grpo``/``gspo`` they are the advantages, as in slime), ``loss_masks`` (one
  entry per response token; the sample then trains with it) and ``raw_reward`` (when given, its mean is
  ``train/slime_raw_reward``). ``tokens`` and ``response_lengths``, when given, must be the samples' own (slick
  trains the tokens the engine sampled); the dict's other keys are not read.
- ``--rollout-data-postprocess-path``: ``fn(args, rollout_id, rollout_data) -> None`` after the step's logprobs
  and advantages, before any optimizer step (the critic's too), as slime calls it on its actors. ``rollout_data``
  is slime's dict of per-sample entries: ``tokens`` (prompt + response ids, a long tensor), ``response_lengths``,
  ``total_lengths``, ``loss_masks`` (int tensors), ``rewards`` (the scalars the estimator got),
  ``advantages`` and ``returns`` (float tensors; ``returns`` copies the advantages when the run has no critic,
  as slime's GRPO does), ``sample_indices``, ``truncated``, and when computed ``log_probs`` (the trainer's old
  logprobs; absent when the step is on-policy, as in slime), ``ref_log_probs``, ``rollout_log_probs`` and
  ``values``. Changes the function makes (in place or by replacing an entry) to ``loss_masks``, ``advantages``
  and, with a critic, ``returns`` are trained on; slime's actor sees only its data-parallel share, slick's
  function the whole step. ``rollout_id`` is the step.

``args`` is the run's flags as a namespace.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Optional

import torch

from slick.algo.batch import TrainBatch
from slick.compat.view import to_slime
from slick.config import Config
from slick.plugins import load_function
from slick.types import Status

CONVERT_FLAG = "--custom-convert-samples-to-train-data-path"
POSTPROCESS_FLAG = "--rollout-data-postprocess-path"


class SlimeTrainData:
    """The run's slime train-data hooks (build with :meth:`from_config`; None when neither flag is set)."""

    def __init__(self, cfg: Config, tokenizer, convert: Optional[Callable], postprocess: Optional[Callable]):
        self.args = argparse.Namespace(**cfg.flat())
        self.tok, self.convert, self.postprocess = tokenizer, convert, postprocess

    @classmethod
    def from_config(cls, cfg: Config, tokenizer) -> Optional["SlimeTrainData"]:
        convert = load_function(cfg.custom_convert_samples_to_train_data_path, CONVERT_FLAG)
        postprocess = load_function(cfg.rollout_data_postprocess_path, POSTPROCESS_FLAG)
        return None if convert is None and postprocess is None else cls(cfg, tokenizer, convert, postprocess)

    def convert_samples(self, samples: list, rewards: list[float]) -> tuple[list[float], dict]:
        """The convert function on ``samples``: the rewards to train with (``rewards``, slick's scalars, are not
        passed: slime's function reads the samples'); the samples take its loss masks."""
        views = [to_slime(s, self.tok.decode(s.prompt_ids, skip_special_tokens=False)) for s in samples]
        out = self.convert(self.args, views)
        if not isinstance(out, dict):
            raise ValueError(f"{CONVERT_FLAG}: must return slime's train-data dict, got {type(out).__name__}")
        for key in ("rewards", "loss_masks"):
            if key not in out:
                raise ValueError(f"{CONVERT_FLAG}: the train-data dict has no {key!r}")
        for key in ("tokens", "response_lengths", "rewards", "loss_masks", "raw_reward"):
            if key in out and len(out[key]) != len(samples):
                raise ValueError(f"{CONVERT_FLAG}: {key!r} has {len(out[key])} entries for {len(samples)} samples "
                                 f"(slick trains every sample of the step)")
        if "tokens" in out and [list(map(int, t)) for t in out["tokens"]] != [v.tokens for v in views] or \
                "response_lengths" in out and list(map(int, out["response_lengths"])) != \
                [len(s.response_ids) for s in samples]:
            raise ValueError(f"{CONVERT_FLAG}: the train data's tokens or response_lengths are not the samples'; "
                             f"slick trains the tokens the engine sampled")
        masks = [[int(x) for x in m] for m in out["loss_masks"]]
        for s, m in zip(samples, masks):
            if len(m) != len(s.response_ids):
                raise ValueError(f"{CONVERT_FLAG}: sample index {s.index}: loss_masks has {len(m)} entries for a "
                                 f"{len(s.response_ids)}-token response")
        processed = [float(r) for r in out["rewards"]]
        if not all(math.isfinite(r) for r in processed):
            raise ValueError(f"{CONVERT_FLAG}: returned a non-finite reward")
        for s, m in zip(samples, masks):
            s.loss_mask = m
        metrics = {}
        if "raw_reward" in out:
            metrics["train/slime_raw_reward"] = sum(float(r) for r in out["raw_reward"]) / max(len(samples), 1)
        return processed, metrics

    def postprocess_batch(self, batch: TrainBatch, step: int) -> TrainBatch:
        """The post-process function on ``batch`` (with its logprobs and advantages) as slime's dict; ``batch``
        with the loss masks, advantages and (with a critic) returns it leaves."""
        data = rollout_data(batch)
        tokens, lengths = [t.tolist() for t in data["tokens"]], list(data["response_lengths"])
        self.postprocess(self.args, step, data)
        for key in ("tokens", "response_lengths", "loss_masks", "advantages", "returns"):
            if key not in data or len(data[key]) != len(batch):
                raise ValueError(f"{POSTPROCESS_FLAG}: rollout_data[{key!r}] must keep one entry per sample "
                                 f"({len(batch)})")
        if [list(map(int, t)) for t in data["tokens"]] != tokens or list(data["response_lengths"]) != lengths:
            raise ValueError(f"{POSTPROCESS_FLAG}: the function changed tokens or response_lengths; slick trains "
                             f"the tokens the engine sampled")
        masks = [_per_token(m, n, "loss_masks").round().int().tolist() for m, n in zip(data["loss_masks"], lengths)]
        adv = [_per_token(a, n, "advantages") for a, n in zip(data["advantages"], lengths)]
        for s, m in zip(batch.samples, masks):   # the samples as trained (debug dumps, the rollout store)
            s.loss_mask = m
        columns: dict[str, Any] = dict(loss_mask=masks, advantages=adv)
        if batch.returns is not None:
            columns["returns"] = [_per_token(r, n, "returns") for r, n in zip(data["returns"], lengths)]
        return batch.with_columns(**columns)


def _per_token(x, n: int, key: str) -> torch.Tensor:
    t = torch.as_tensor(x).detach().float().cpu().reshape(-1)
    if t.numel() != n:
        raise ValueError(f"{POSTPROCESS_FLAG}: rollout_data[{key!r}] has an entry of {t.numel()} values for a "
                         f"{n}-token response")
    return t


def rollout_data(batch: TrainBatch) -> dict:
    """``batch`` as slime's actor-side dict of per-sample entries (module doc)."""
    samples = batch.samples

    def tensors(col, dtype=torch.float32):
        return [torch.as_tensor(x, dtype=dtype).detach().clone().cpu() for x in col]

    data: dict[str, Any] = {
        "tokens": [torch.tensor(list(s.prompt_ids) + list(s.response_ids), dtype=torch.long) for s in samples],
        "response_lengths": [len(t) for t in batch.tokens],
        "total_lengths": [len(s.prompt_ids) + len(s.response_ids) for s in samples],
        "loss_masks": tensors(batch.loss_mask, torch.int),
        "rewards": list(batch.rewards),
        "sample_indices": [s.index for s in samples],
        "truncated": [1 if s.status == Status.TRUNCATED else 0 for s in samples],
        "advantages": tensors(batch.advantages),
        "returns": tensors(batch.returns if batch.returns is not None else batch.advantages),
    }
    for key, col in (("log_probs", batch.old_logprobs), ("ref_log_probs", batch.ref_logprobs),
                     ("values", batch.values)):
        if col is not None:
            data[key] = tensors(col)
    if all(len(s.rollout_logprobs) == len(s.response_ids) for s in samples):
        data["rollout_log_probs"] = tensors([s.rollout_logprobs for s in samples])
    return data

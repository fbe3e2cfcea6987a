"""slime's end-of-rollout hooks, called with slime's arguments after each training rollout.

- ``--rollout-sample-filter-path``: ``filter(args, groups) -> None`` on the step's kept groups, in slime's Sample
  shape; a sample it marks ``remove_sample = True`` stays in the batch (its reward still counts in its group)
  and trains with loss mask 0, as in slime.
- ``--rollout-sample-hook-path`` (repeatable): ``hook(args, sample, *, rollout_id=None, evaluation=False)``, sync
  or async, on every generated sample before its reward, in order; it returns the (changed) slime Sample or None
  (then its changes to the one it got count). Carried back: ``loss_mask`` (same length), ``remove_sample``
  (loss mask 0), ``status``, ``label`` and ``metadata``; a hook that changes the tokens or the response is
  refused with a ValueError naming the flag (slick trains the engine's tokens). ``rollout_id`` is the step.
- ``--custom-reward-post-process-path``: ``fn(args, samples) -> (raw_rewards, rewards)`` on the step's samples
  (flat, in batch order, each with its reward) replaces GRPO's group normalisation, as in slime: ``rewards``
  are the samples' advantages (``--advantage-estimator grpo`` or ``gspo``; the config implies
  ``--disable-rewards-normalization``). ``train/slime_raw_reward`` is the mean of ``raw_rewards``.
- ``--rollout-all-samples-process-path``: ``process(args, all_groups, data_source) -> None`` on every group the
  step generated, those the dynamic-sampling filter dropped included, ordered by group; ``data_source`` is the
  run's DataSource.

``args`` is the namespace a slime generate function gets (the run's flags); the Sample views share each sample's
``metadata`` dict, so what a hook writes there travels with the sample.
"""
from __future__ import annotations

import argparse
import inspect
import math
from typing import Any, Callable, Optional

from slick.compat.view import to_slime
from slick.config import Config
from slick.plugins import load_function
from slick.types import Sample, Status


class SlimeRolloutHooks:
    def __init__(self, cfg: Config, tokenizer, sample_filter: Optional[Callable], process_all: Optional[Callable]):
        self.cfg, self.tok = cfg, tokenizer
        self.sample_filter, self.process_all = sample_filter, process_all

    @classmethod
    def from_config(cls, cfg: Config, tokenizer) -> Optional["SlimeRolloutHooks"]:
        f = load_function(cfg.rollout_sample_filter_path, "--rollout-sample-filter-path")
        p = load_function(cfg.rollout_all_samples_process_path, "--rollout-all-samples-process-path")
        return None if f is None and p is None else cls(cfg, tokenizer, f, p)

    def _view(self, groups: list[list[Sample]]) -> list[list[Any]]:
        return [[to_slime(s, self.tok.decode(s.prompt_ids, skip_special_tokens=False)) for s in g] for g in groups]

    def after_rollout(self, kept: list[list[Sample]], generated: list[list[Sample]], data_source) -> int:
        """Run the hooks; returns how many kept samples the sample filter removed from the loss."""
        args = argparse.Namespace(**self.cfg.flat())
        removed = 0
        if self.sample_filter is not None:
            view = self._view(kept)
            self.sample_filter(args, view)
            for g, vg in zip(kept, view):
                for s, v in zip(g, vg):
                    if v.remove_sample:
                        s.loss_mask = [0] * len(s.response_ids)
                        s.metadata["remove_sample"] = True
                        removed += 1
        if self.process_all is not None:
            ordered = sorted(generated, key=lambda g: g[0].group_index if g else -1)
            self.process_all(args, self._view(ordered), data_source)
        return removed


class RewardPostProcess:
    """``--custom-reward-post-process-path`` (module doc)."""

    def __init__(self, cfg: Config, tokenizer, fn: Callable):
        self.cfg, self.tok, self.fn = cfg, tokenizer, fn

    @classmethod
    def from_config(cls, cfg: Config, tokenizer) -> Optional["RewardPostProcess"]:
        fn = load_function(cfg.custom_reward_post_process_path, "--custom-reward-post-process-path")
        return None if fn is None else cls(cfg, tokenizer, fn)

    def __call__(self, samples: list[Sample], rewards: list[float]) -> tuple[list[float], dict]:
        views = [to_slime(s, self.tok.decode(s.prompt_ids, skip_special_tokens=False)) for s in samples]
        out = self.fn(argparse.Namespace(**self.cfg.flat()), views)
        flag = "--custom-reward-post-process-path"
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise ValueError(f"{flag}: must return (raw_rewards, rewards), got {type(out).__name__}")
        raw, processed = (list(x) for x in out)
        if len(raw) != len(samples) or len(processed) != len(samples):
            raise ValueError(f"{flag}: returned {len(raw)} raw rewards and {len(processed)} rewards for "
                             f"{len(samples)} samples")
        processed = [float(x) for x in processed]
        if not all(math.isfinite(x) for x in processed):
            raise ValueError(f"{flag}: returned a non-finite reward")
        return processed, {"train/slime_raw_reward": sum(float(x) for x in raw) / max(len(raw), 1)}


class SampleHooks:
    """``--rollout-sample-hook-path`` (module doc)."""

    FLAG = "--rollout-sample-hook-path"

    def __init__(self, cfg: Config, tokenizer, hooks: list[Callable]):
        self.cfg, self.tok, self.hooks = cfg, tokenizer, hooks

    @classmethod
    def from_config(cls, cfg: Config, tokenizer) -> Optional["SampleHooks"]:
        hooks = [load_function(p, cls.FLAG) for p in cfg.rollout_sample_hook_path]
        return cls(cfg, tokenizer, hooks) if hooks else None

    @staticmethod
    def _kwargs(hook: Callable, kwargs: dict) -> dict:
        params = inspect.signature(hook).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return kwargs
        names = {p.name for p in params}
        return {k: v for k, v in kwargs.items() if k in names}

    async def __call__(self, sample: Sample, rollout_id: Optional[int], evaluation: bool) -> None:
        view = to_slime(sample, self.tok.decode(sample.prompt_ids, skip_special_tokens=False))
        tokens, response = list(view.tokens), view.response
        args = argparse.Namespace(**self.cfg.flat())
        for hook in self.hooks:
            out = hook(args, view, **self._kwargs(hook, dict(rollout_id=rollout_id, evaluation=evaluation)))
            if inspect.isawaitable(out):
                out = await out
            if out is not None:
                if type(out) is not type(view):
                    raise TypeError(f"{self.FLAG}: a hook returned {type(out).__name__}, expected Sample or None")
                view = out
        if list(view.tokens) != tokens or view.response != response:
            raise ValueError(f"{self.FLAG}: a hook changed the sample's tokens or response; slick trains the tokens "
                             f"the engine sampled (change them in --custom-generate-function-path)")
        n = len(sample.response_ids)
        mask = list(view.loss_mask) if view.loss_mask is not None else list(sample.loss_mask)
        if len(mask) != n:
            raise ValueError(f"{self.FLAG}: loss_mask has {len(mask)} entries for a {n}-token response")
        sample.loss_mask = [0] * n if view.remove_sample else [int(m) for m in mask]
        sample.status, sample.label = Status(view.status.value), view.label
        if isinstance(view.metadata, dict):
            sample.metadata = view.metadata

"""slime's ``--eval-function-path``: ``fn(args, rollout_id, data_source, evaluation=True)``, run in place of
slick's evaluation whenever the run evaluates (--eval-interval with --eval-prompt-data, as slime requires).

slick calls it as slime's rollout manager does, on a worker thread (the function is synchronous in slime and
usually runs its coroutines with ``slime.utils.async_utils.run``; an ``async def`` one is awaited): ``args`` is
the run's flags as a namespace with ``sglang_router_ip``/``sglang_router_port`` pointing at an SGLang
``/generate`` front over the rollout's engine (the one slime generate plug-ins get, slick/rollout/slime_generate.py;
``GenerateState(args).tokenizer`` is the run's), ``rollout_id`` the last trained step (0 before any), and
``data_source`` the run's DataSource. It returns slime's ``RolloutFnEvalOutput(data, metrics)`` or, as slime's
legacy functions do, the ``data`` dict itself: ``{name: {"rewards": [...], "truncated": [...], ...}}``.

Logged as slime logs it: ``eval/<name>`` (the rewards' mean), ``eval/<name>-truncated_ratio`` (when
``truncated`` is given) and the output's own ``metrics``, plus ``perf/eval_time``.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import time
from typing import Callable, Optional

from slick.compat.slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slick.compat.slime.rollout.sglang_rollout import register_tokenizer
from slick.config import Config
from slick.plugins import load_function
from slick.rollout.slime_generate import SLIME_DEFAULTS, SGLangFront

FLAG = "--eval-function-path"


class SlimeEval:
    """The run's slime eval function (build with :meth:`from_config`; None when the flag is not set)."""

    def __init__(self, cfg: Config, fn: Callable, tokenizer):
        self.cfg, self.fn, self.tok = cfg, fn, tokenizer
        register_tokenizer(cfg.hf_checkpoint, tokenizer)     # GenerateState(args).tokenizer is the run's

    @classmethod
    def from_config(cls, cfg: Config, tokenizer) -> Optional["SlimeEval"]:
        fn = load_function(cfg.eval_function_path, FLAG)
        return None if fn is None else cls(cfg, fn, tokenizer)

    async def __call__(self, manager, rollout_id: int) -> dict:
        """Run the function against ``manager``'s engine and data source; eval/* metrics as slime logs them."""
        t0 = time.perf_counter()
        eos = {self.tok.eos_token_id} if self.tok.eos_token_id is not None else set()
        front = SGLangFront(lambda: manager.engine, self.tok, set(getattr(manager.engine, "eos_ids", ()) or ()) | eos)
        port = await front.start()
        try:
            args = argparse.Namespace(**{**SLIME_DEFAULTS, **self.cfg.flat()}, sglang_router_ip="127.0.0.1",
                                      sglang_router_port=port)
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(None, lambda: self.fn(args, rollout_id, manager.data, evaluation=True))
            if inspect.isawaitable(out):
                out = await out
        finally:
            await front.close()
        metrics = eval_metrics(out)
        metrics["perf/eval_time"] = time.perf_counter() - t0
        return metrics


def eval_metrics(out) -> dict:
    """slime's eval logging of a ``RolloutFnEvalOutput`` (or its bare ``data`` dict)."""
    if isinstance(out, RolloutFnTrainOutput):
        raise ValueError(f"{FLAG}: returned RolloutFnTrainOutput; an eval function returns RolloutFnEvalOutput "
                         f"or its data dict")
    if not isinstance(out, RolloutFnEvalOutput):
        out = RolloutFnEvalOutput(data=out)
    if not isinstance(out.data, dict):
        raise ValueError(f"{FLAG}: the eval data must be a dict {{name: {{'rewards': [...]}}}}, got "
                         f"{type(out.data).__name__}")
    metrics = {k: float(v) for k, v in (out.metrics or {}).items()}
    for name, entry in out.data.items():
        rewards = entry.get("rewards") if isinstance(entry, dict) else None
        if not rewards:
            raise ValueError(f"{FLAG}: eval data {name!r} has no rewards")
        metrics[f"eval/{name}"] = sum(float(r) for r in rewards) / len(rewards)
        if entry.get("truncated"):
            truncated = entry["truncated"]
            metrics[f"eval/{name}-truncated_ratio"] = sum(float(t) for t in truncated) / len(truncated)
    return metrics

"""The teacher of on-policy distillation behind one seam: ``await teacher.score(samples)`` returns the teacher's
logprob of every response token of every sample (fp32 CPU tensors ``[T_i]``), the ``teacher_logprobs`` column of
the training batch (slick/algo/batch.py). Two implementations:

- :class:`TrainerTeacher` (``--opd-type trainer``, slime's ``megatron``): the frozen teacher forward loaded beside
  the policy in every trainer process (slick/train/teacher.py), run on the training thread.
- :class:`EngineTeacher` (``--opd-type engine``, slime's ``sglang``): an inference engine that is never updated
  scores prompt + response through its prompt logprobs (``prompt_top_logprobs``, the contract of
  ``VllmEngine.prompt_top_logprobs``: ``top[i]`` holds the logprob of ``ids[i + 1]``). An in-process LocalEngine
  on ``--opd-teacher-load``, or a server at ``--opd-teacher-url`` (slick serve, SGLang, sglang-router, vLLM).

Both score at temperature 1 over the student's own token ids (one tokenizer, checked at start).
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

import torch

from slick.engines.answer_check import check_logprob


class TeacherError(ValueError):
    """The teacher answered something the run must not train on (names the teacher and the sample)."""


class TrainerTeacher:
    """``trainer.compute_logprobs(samples, "teacher")`` through ``run_on_trainer(fn, *args)`` (the training
    thread), so the event loop keeps serving the engines meanwhile."""

    def __init__(self, trainer, run_on_trainer: Callable[..., Awaitable]):
        self.trainer = trainer
        self.run_on_trainer = run_on_trainer

    async def score(self, samples: Sequence) -> list[torch.Tensor]:
        return await self.run_on_trainer(self.trainer.compute_logprobs, list(samples), "teacher")

    async def close(self) -> None:
        """Nothing of its own: the teacher forward is the trainer's."""

    def close_sync(self) -> None:
        """Nothing of its own: the teacher forward is the trainer's."""


def response_logprobs(ids: Sequence[int], prompt_len: int, top: Sequence[dict]) -> torch.Tensor:
    """The logprobs of ``ids[prompt_len:]`` (fp32 ``[len(ids) - prompt_len]``) from prompt logprobs ``top`` of
    ``ids`` (``top[i]`` maps ``ids[i + 1]`` to its logprob)."""
    if len(top) != len(ids) - 1:
        raise ValueError(f"prompt logprobs: {len(top)} positions for {len(ids)} tokens (need {len(ids) - 1})")
    out = []
    for i in range(prompt_len - 1, len(ids) - 1):
        lp = top[i].get(int(ids[i + 1])) if isinstance(top[i], dict) else None
        if lp is None:
            raise ValueError(f"prompt logprobs: position {i} does not score the token that follows ({ids[i + 1]})")
        out.append(check_logprob(lp, f"the teacher's logprob at position {i}"))   # finite, <= 0: never trained on +5
    return torch.tensor(out, dtype=torch.float32)


class EngineTeacher:
    """A teacher served by ``engine`` (never updated): each sample's prompt + response scored with
    ``engine.prompt_top_logprobs(ids, 0)``, at most ``concurrency`` samples at a time. ``owned``: the engine was
    started for the teacher and closes with it."""

    def __init__(self, engine, concurrency: int = 16, owned: bool = True):
        if not hasattr(engine, "prompt_top_logprobs"):
            raise TypeError(f"{type(engine).__name__} returns no prompt logprobs (prompt_top_logprobs): it cannot "
                            "serve as an on-policy distillation teacher")
        self.engine = engine
        self.where = " or ".join(getattr(engine, "urls", None) or [type(engine).__name__])   # for error messages
        self.concurrency = max(1, int(concurrency))
        self.owned = owned

    async def score(self, samples: Sequence) -> list[torch.Tensor]:
        sem = asyncio.Semaphore(self.concurrency)

        async def one(s) -> torch.Tensor:
            if not s.response_ids:
                return torch.zeros(0)
            ids = [int(t) for t in s.prompt_ids] + [int(t) for t in s.response_ids]
            async with sem:
                top = await self.engine.prompt_top_logprobs(ids, 0)
            try:
                return response_logprobs(ids, len(s.prompt_ids), top)
            except ValueError as e:
                raise TeacherError(f"teacher {self.where}: unusable answer for sample {s.index}: {e}") from None

        return list(await asyncio.gather(*(one(s) for s in samples)))

    async def close(self) -> None:
        if self.owned:
            await self.engine.close()

    def close_sync(self) -> None:
        """Close an in-process engine without an event loop (a failed build); an HTTP client's session goes with
        its loop."""
        if self.owned and hasattr(self.engine, "close_sync"):
            self.engine.close_sync()

"""Interruptible generation: the engine as the rollout sees it, across weight updates.

:class:`InterruptibleEngine` wraps any engine of ``slick.engine.base`` and is handed to the rollout code
(default or custom generate functions) in place of the raw engine. It adds what asynchronous training needs,
and nothing the rollout code has to know about:

* **Tagged requests.** Every request gets a request id and a *kind*: the value of :data:`REQUEST_KIND` in the
  asyncio task that made it ("train" for the producer's groups, "eval" for evaluation). :meth:`abort_kind`
  aborts the requests of one kind only, so an eval running beside a training rollout is never aborted by it.
* **Weight updates** (:meth:`update`), in one of three modes (``--async-weight-update``):

  - ``wait``: the caller has already let the in-flight rollouts finish; the update just runs.
  - ``continue``: pause -> load -> set version -> continue. Requests in flight keep their KV cache and go on
    under the new weights; each token carries the version that sampled it.
  - ``resubmit``: the "train" requests in flight are aborted, the weights loaded, and every aborted request is
    resubmitted as prompt + tokens so far (keeping their logprobs and per-token versions) with the tokens it
    has left. The caller of ``generate`` gets one Generation, as if nothing had happened.

  No generated token is thrown away in any mode.
* **Stopping** (:meth:`abort_kind` outside an update): the request returns with finish reason ``abort`` and
  the tokens so far; the caller keeps them (partial samples are saved in async checkpoints and continued).
"""
from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from typing import Awaitable, Callable, Optional

from slick.engines.fault import PartialGeneration
from slick.types import Generation, SamplingParams

REQUEST_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("slick_request_kind", default="eval")
MODES = ("wait", "continue", "resubmit")


class InterruptibleEngine:
    """An engine wrapper with per-kind request tracking and interruptible weight updates (module doc)."""

    def __init__(self, engine, mode: str = "wait", timeout: float = 600.0):
        if mode not in MODES:
            raise ValueError(f"--async-weight-update {mode!r}: choose one of {', '.join(MODES)}")
        self.engine, self.mode, self.timeout = engine, mode, float(timeout)
        self._ids = itertools.count()
        self._inflight: dict[str, str] = {}          # rid -> kind
        self._idle = asyncio.Event()                  # set while nothing is in flight
        self._idle.set()
        self._started = 0                             # requests made so far
        self._resuming = asyncio.Event()
        self._resuming.set()                          # cleared while a resubmit-mode update runs
        self.resubmitted = 0                          # requests resubmitted after an update (metric)
        self.paused_time = 0.0                        # seconds generation was paused or held for updates

    # ---------------------------------------------------------------- the Engine protocol, passed through
    def __getattr__(self, name):                      # health, get_weight_version, close, stats, ...
        return getattr(self.engine, name)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, rid: Optional[str] = None
                       ) -> Generation:
        kind = REQUEST_KIND.get()
        base = rid or f"{kind}-{next(self._ids)}"
        acc = PartialGeneration()                    # tokens, logprobs, versions over the resubmissions
        part = 0
        while True:
            if kind == "train":                      # held while a resubmit-mode update runs
                await self._resuming.wait()
            rid_now = base if part == 0 else f"{base}.{part}"
            self._inflight[rid_now] = kind
            self._idle.clear()
            self._started += 1
            try:
                gen = await self.engine.generate(acc.prompt(prompt_ids), acc.sampling(sampling), rid=rid_now)
            finally:
                self._inflight.pop(rid_now, None)
                if not self._inflight:
                    self._idle.set()
            acc.add(gen)
            resubmit = (gen.finish_reason == "abort" and kind == "train" and not self._resuming.is_set()
                        and acc.left(sampling) > 0)
            if not resubmit:
                return acc.result(gen, len(prompt_ids))
            self.resubmitted += 1
            part += 1

    # ---------------------------------------------------------------- control
    def busy(self) -> bool:
        """Whether any request (of any kind) is in flight."""
        return bool(self._inflight)

    async def wait_idle(self, timeout: float, settle: float = 0.02) -> float:
        """Wait until no request is in flight and none has started for ``settle`` seconds (requests about to be
        made, such as those of a group just admitted, get the time to start); at most ``timeout`` seconds, else a
        TimeoutError naming what it waited for. Returns the seconds waited."""
        t0 = time.perf_counter()

        async def quiet():
            while True:
                await self._idle.wait()
                started = self._started
                await asyncio.sleep(settle)
                if self._idle.is_set() and self._started == started:
                    return
        try:
            await asyncio.wait_for(quiet(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"waited {timeout:.0f}s (--async-timeout) for the engine's {len(self._inflight)} "
                               f"requests in flight to finish before a training step") from None
        return time.perf_counter() - t0

    def inflight(self, kind: str = "train") -> int:
        return sum(1 for k in self._inflight.values() if k == kind)

    async def abort_kind(self, kind: str = "train") -> int:
        """Abort every in-flight request of ``kind``; returns how many were asked to stop."""
        rids = [r for r, k in list(self._inflight.items()) if k == kind]
        await asyncio.gather(*(self.engine.abort(r) for r in rids))
        return len(rids)

    async def update(self, load: Callable[[], Awaitable[dict]]) -> dict:
        """Run ``load()`` (which pushes the trainer's weights and sets the version) in this engine's mode."""
        t0 = time.perf_counter()
        if self.mode == "continue":
            await asyncio.wait_for(self.engine.pause_generation(), self.timeout)
            try:
                metrics = await load()
            finally:
                await asyncio.wait_for(self.engine.continue_generation(), self.timeout)
        elif self.mode == "resubmit":
            self._resuming.clear()
            try:
                await self.abort_kind("train")
                metrics = await load()
            finally:
                self._resuming.set()
        else:
            metrics = await load()
        self.paused_time += time.perf_counter() - t0
        return metrics

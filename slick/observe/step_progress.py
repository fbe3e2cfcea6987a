"""Progress inside a long step: once a step has run ``after`` seconds, one line every ``period`` seconds saying
what it is doing, how far it is, and an estimate of what is left.

* **Rollout**: the tokens the in-process engine generated since the step began, their rate, and an ETA that is
  an upper bound (every response taken to ``--rollout-max-response-len``; most stop sooner). Engines in other
  processes are not counted; their line says how long the rollout has run.
* **The trainer's passes** (``Trainer.work``): the micro-batch under way of how many, and an ETA at the pace of
  the micro-batches done so far.

The bar (or the one line per step) of ``slick.observe.progress`` reports finished steps; these lines fill the
minutes inside one, for long responses or big models (docs/training.md, "Long responses and bigger models").
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

from slick.observe.progress import _fmt_eta

AFTER_S = 30.0      # a step shorter than this prints nothing
PERIOD_S = 30.0


class StepWatch:
    """Lines about the step under way. ``engine_tokens()``: the in-process engine's running total of generated
    tokens (None when not known); ``trainer_work()``: ``(what, micro-batches done, of how many)`` of the trainer's
    pass under way, or None; ``samples`` x ``max_tokens``: the most a step's rollout generates."""

    def __init__(self, write: Callable[[str], None], engine_tokens: Callable[[], Optional[int]],
                 trainer_work: Callable[[], Optional[tuple]], samples: int, max_tokens: int, total_steps: int,
                 after: float = AFTER_S, period: float = PERIOD_S, clock: Callable[[], float] = time.monotonic):
        self.write, self.engine_tokens, self.trainer_work = write, engine_tokens, trainer_work
        self.samples, self.max_tokens, self.total_steps = samples, max_tokens, total_steps
        self.after, self.period, self.clock = after, period, clock
        self._step = 0
        self._t0 = self._tokens0 = None
        self._pass: Optional[tuple] = None      # (what, started at, micro-batches done then)

    def begin(self, step: int) -> None:
        """The step ``step`` (0-based) starts now."""
        self._step, self._t0, self._tokens0, self._pass = step, self.clock(), self.engine_tokens(), None

    def line(self) -> str:
        """What the step is doing now, in one line."""
        now = self.clock()
        head = f"step {self._step + 1}/{self.total_steps}, {_fmt_eta(now - self._t0)} in"
        work = self.trainer_work()
        if work is not None:
            what, done, total = work
            if self._pass is None or self._pass[0] != what or self._pass[2] > done:
                self._pass = (what, now, done)
            _, since, done0 = self._pass
            text = f"{head}: {what}, micro-batch {done + 1} of {total}"
            if done > done0:
                text += f", eta {_fmt_eta((now - since) / (done - done0) * (total - done))}"
            return text
        tokens = self.engine_tokens()
        if tokens is None or self._tokens0 is None:
            return f"{head}: rollout"
        made, most = tokens - self._tokens0, self.samples * self.max_tokens
        rate = made / max(now - self._t0, 1e-9)
        text = f"{head}: rollout, {made:,} tokens generated ({rate:.0f} tok/s; {self.samples} responses of <= " \
               f"{self.max_tokens:,} tokens)"
        if made and made < most:
            text += f", eta <= {_fmt_eta((most - made) / rate)}"
        return text

    async def watch(self, step: int) -> None:
        """Write :meth:`line` every ``period`` seconds from ``after`` seconds into step ``step``, until cancelled."""
        self.begin(step)
        await asyncio.sleep(self.after)
        while True:
            self.write(self.line())
            await asyncio.sleep(self.period)

"""The rollout side's timeline: what is generating and what is waiting, over time (docs/async.md, "Timeline").

One :class:`Timeline` per run, shared by the rollout manager, the multi-turn rollout, the async producer and the
drivers. Four activities are counted while they are in flight:

* ``generate``: an engine request (one ``engine.generate`` call, :class:`TimedEngine`); the engine is **busy**
  while at least one is in flight;
* ``sample``: a sample's whole generation phase (every turn of a multi-turn episode, its tool calls included);
* ``reward``: a reward call (a sample's, or a group's with ``--group-rm``) in flight;
* ``tool``: a tool call or environment step of a multi-turn episode in flight.

From these, per step (:meth:`Timeline.take`): ``perf/engine_busy_fraction`` (the share of the step's wall time the
engine had a request in flight), and the seconds a reward (or tool) wait was **overlapped** (the engine was busy
meanwhile) or **exposed** (it was not: nothing else could run). With ``trace=True`` every span is also kept as a
Chrome trace event (:meth:`events`), one track per group plus the engine's and the trainer's, written by the driver
as ``--trace-file`` (``slick.observe.trace``).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Optional

KINDS = ("generate", "sample", "reward", "tool")


class Timeline:
    """Counts of activities in flight, integrated over time (module doc); optionally a trace of spans."""

    def __init__(self, *, trace: bool = False, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.t0 = self._last = self._mark = clock()
        self.n = dict.fromkeys(KINDS, 0)
        self._acc = dict.fromkeys(("busy", "reward_overlapped", "reward_exposed", "tool_overlapped",
                                   "tool_exposed"), 0.0)
        self._peak = dict.fromkeys(KINDS, 0)
        self._events: Optional[list[dict]] = [] if trace else None
        self._busy_since: Optional[float] = None

    # ---------------------------------------------------------------- accounting
    def _advance(self) -> float:
        now = self.clock()
        dt, self._last = now - self._last, now
        busy = self.n["generate"] > 0
        if busy:
            self._acc["busy"] += dt
        for kind in ("reward", "tool"):
            if self.n[kind]:
                self._acc[f"{kind}_{'overlapped' if busy else 'exposed'}"] += dt
        return now

    def begin(self, kind: str) -> float:
        now = self._advance()
        self.n[kind] += 1
        self._peak[kind] = max(self._peak[kind], self.n[kind])
        if kind == "generate" and self.n[kind] == 1:
            self._busy_since = now
        return now

    def end(self, kind: str) -> float:
        now = self._advance()
        self.n[kind] -= 1
        if kind == "generate" and self.n[kind] == 0 and self._busy_since is not None:
            self.add("busy", "engine", self._busy_since, now)
            self._busy_since = None
        return now

    @contextlib.asynccontextmanager
    async def span(self, kind: str, track: Any = None, name: Optional[str] = None, **args):
        """Count ``kind`` in flight for the ``async with`` body; trace it on ``track`` (when given) as ``name``."""
        t = self.begin(kind)
        try:
            yield
        finally:
            end = self.end(kind)
            if track is not None:
                self.add(name or kind, track, t, end, **args)

    # ---------------------------------------------------------------- trace events
    def add(self, name: str, track: Any, start: float, end: float, **args) -> None:
        """A complete span on ``track`` (a group's, "engine", "trainer", ...) from ``start`` to ``end`` (clock)."""
        if self._events is not None:
            self._events.append({"name": name, "track": str(track), "ts": start - self.t0,
                                 "dur": max(end - start, 0.0), "args": args})

    def instant(self, name: str, track: Any, **args) -> None:
        if self._events is not None:
            self._events.append({"name": name, "track": str(track), "ts": self.clock() - self.t0, "dur": None,
                                 "args": args})

    def events(self) -> list[dict]:
        """The spans so far (seconds since the timeline started), in the order they ended."""
        return list(self._events or [])

    @property
    def tracing(self) -> bool:
        return self._events is not None

    # ---------------------------------------------------------------- waits and metrics
    def take(self) -> dict:
        """The step's timeline metrics since the last call (or the start), then start a new period."""
        now = self._advance()
        wall = max(now - self._mark, 1e-9)
        a = self._acc
        m = {"perf/engine_busy_time": a["busy"], "perf/engine_busy_fraction": min(a["busy"] / wall, 1.0),
             "perf/reward_wait_overlapped_time": a["reward_overlapped"],
             "perf/reward_wait_exposed_time": a["reward_exposed"],
             "perf/tool_wait_overlapped_time": a["tool_overlapped"], "perf/tool_wait_exposed_time": a["tool_exposed"],
             "rollout/max_requests_in_flight": float(self._peak["generate"]),
             "rollout/max_rewards_in_flight": float(self._peak["reward"])}
        self._acc = dict.fromkeys(a, 0.0)
        self._peak = dict(self.n)
        self._mark = now
        return m


class TimedEngine:
    """The engine as the rollout code sees it, with each ``generate`` counted on the timeline (the engine's busy
    time). Everything else passes through to the wrapped engine."""

    def __init__(self, engine, timeline: Timeline):
        self.engine, self.timeline = engine, timeline

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, *args, **kwargs):
        self.timeline.begin("generate")
        try:
            return await self.engine.generate(prompt_ids, sampling, *args, **kwargs)
        finally:
            self.timeline.end("generate")

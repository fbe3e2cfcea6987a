"""The producer of asynchronous training: keeps the buffer fed while the trainer trains.

Groups are taken from the DataSource one at a time and generated concurrently (``RolloutManager.run_group``,
in tasks whose :data:`~slick.rollout.interrupt.REQUEST_KIND` is "train"). Finished groups enter the buffer
**in admission order** (a group that finishes early waits for the ones admitted before it), so the trainer
consumes groups in the order the sync driver would, and the staleness bound below is exact.

Admission control (AReaL's capacity rule, in rollout-step units). With ``B`` groups per step, ``lead`` the
rollout steps the producer may run ahead (``Producer.lead``), ``u`` the rollout steps whose weights the
engines hold, and ``c`` the groups consumed by the trainer + buffered + in flight, a new group is admitted
only while::

    c < (u + lead + 1) * B      and      buffered + in flight < async_buffer_size * B

A group admitted at position ``c`` is trained at step ``<= c // B <= u + lead``, so its oldest token is at
most ``lead`` steps older than the trainer at that step. The producer waits rather than generating what
would be thrown away; a group that still ends up too stale is dropped by the buffer and counted.

``quiesce()`` stops admission, stops the requests in flight (keeping their tokens) and hands every group
that is not yet trained (buffered, finished, or partial) back to the DataSource in admission order; the
checkpoint then holds them all, and the producer re-admits them first, in that order, without generating a
finished sample again or re-scoring it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from slick.config import Config, ConfigView
from slick.rollout.interrupt import REQUEST_KIND
from slick.types import Sample, Status

log = logging.getLogger("slick.rollout")


class Producer:
    """Admission-controlled, in-order group production into a RolloutBuffer (see the module doc)."""

    def __init__(self, cfg: Config | ConfigView, manager, buffer, data, engine, *, lead: int, synced_steps: int,
                 consumed_steps: int, num_steps: int):
        self.manager, self.buffer, self.data, self.engine = manager, buffer, data, engine
        cfg = cfg.view("rollout")
        self.batch = cfg.rollout_batch_size
        self.lead = lead
        self.num_steps = num_steps                   # no group is generated past the run's last step
        self.capacity = (cfg.async_buffer_size or lead + 1) * self.batch
        self.synced_steps = synced_steps             # u: rollout steps whose weights the engines hold
        self.consumed = consumed_steps * self.batch  # groups the trainer has taken
        self._slots: dict[int, Optional[list[Sample]]] = {}   # admission seq -> finished group (None: running)
        self._tasks: dict[int, asyncio.Task] = {}
        self._next_seq = self._next_release = 0
        self._admitting = True
        self._wake = asyncio.Event()
        self._loop_task: Optional[asyncio.Task] = None
        self.filtered = 0                            # groups dropped by the dynamic-sampling filter
        self._idle_since: Optional[float] = None
        self.idle_time = 0.0                         # seconds with no group generating
        self._error: Optional[BaseException] = None
        self.timeline = manager.timeline             # generation and reward waits in flight; the trace's spans
        self._admitted_at: dict[int, float] = {}     # group index -> when admitted (trace)
        self._released_at: dict[int, float] = {}     # group index -> when it entered the buffer (trace)
        self.peak_in_flight = 0                      # most groups admitted and not yet buffered since take()
        self._generating: set[int] = set()           # admission seqs of groups with a sample still generating
        self._generated = asyncio.Event()            # set while no admitted group is generating
        self._generated.set()

    # ---------------------------------------------------------------- admission
    def _in_pipeline(self) -> int:
        return len(self.buffer) + len(self._slots)

    def _may_admit(self) -> bool:
        c = self.consumed + self._in_pipeline()
        return (self._admitting and c < min(self.synced_steps + self.lead + 1, self.num_steps) * self.batch
                and self._in_pipeline() < self.capacity)

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        REQUEST_KIND.set("train")                   # inherited by every group task created below
        while True:
            while self._may_admit():
                (group,) = self.data.get_groups(1)
                seq = self._next_seq
                self._next_seq += 1
                self._slots[seq] = None
                self._generating.add(seq)
                self._generated.clear()
                self.peak_in_flight = max(self.peak_in_flight, len(self._slots))
                if self.timeline.tracing and group:
                    self._admitted_at[group[0].group_index] = self.timeline.clock()
                self._tasks[seq] = asyncio.get_running_loop().create_task(self._one(seq, group))
            self._mark_idle()
            self._wake.clear()
            await self._wake.wait()

    def _mark_idle(self) -> None:
        if not self._tasks and self._idle_since is None:
            self._idle_since = time.perf_counter()
        elif self._tasks and self._idle_since is not None:
            self.idle_time += time.perf_counter() - self._idle_since
            self._idle_since = None

    def take_idle_time(self) -> float:
        """Seconds with nothing in flight since the last call (the rollout side waiting on the trainer)."""
        now = time.perf_counter()
        idle = self.idle_time + (now - self._idle_since if self._idle_since is not None else 0.0)
        self.idle_time = 0.0
        if self._idle_since is not None:
            self._idle_since = now
        return idle

    def _group_generated(self, seq: int) -> None:
        self._generating.discard(seq)
        if not self._generating:
            self._generated.set()

    async def _one(self, seq: int, group: list[Sample]) -> None:
        try:
            group = await self.manager.run_group(group, generated=lambda: self._group_generated(seq))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - surfaced to the trainer by take()
            self._error = e
            self.buffer.put([])                     # wakes a waiting take()
            raise
        finally:
            self._tasks.pop(seq, None)
            self._group_generated(seq)
        self._slots[seq] = group
        self._release()

    def _release(self) -> None:
        """Move finished groups, in admission order, into the buffer (or drop those the filter rejects).
        A group stopped part-way (by :meth:`quiesce`) stays, and so do the ones admitted after it."""
        ready = []
        while True:
            group = self._slots.get(self._next_release)
            if group is None or any(s.status == Status.ABORTED for s in group):
                break
            del self._slots[self._next_release]
            self._next_release += 1
            if self.manager.keep(group):
                ready.append(group)
            else:
                self.filtered += 1
            self._trace_released(group)
        if ready:
            self.buffer.put(ready)
        self._wake.set()

    def _trace_released(self, group: list[Sample]) -> None:
        if self.timeline.tracing and group:
            g = group[0].group_index
            now = self.timeline.clock()
            self._released_at[g] = now
            self.timeline.add("in flight", f"group {g}", self._admitted_at.pop(g, now), now, index=g)

    def _trace_taken(self, groups: list[list[Sample]], step: int) -> None:
        if self.timeline.tracing:
            now = self.timeline.clock()
            for group in (g for g in groups if g):
                g = group[0].group_index
                self.timeline.add("buffered", f"group {g}", self._released_at.pop(g, now), now, step=step)

    def groups_in_flight(self) -> dict:
        """rollout/groups_in_flight (now) and rollout/max_groups_in_flight (since the last call): groups admitted and
        not yet in the buffer (generating, waiting for rewards, or finished behind an earlier one)."""
        m = {"rollout/groups_in_flight": float(len(self._slots)), "rollout/max_groups_in_flight": float(self.peak_in_flight)}
        self.peak_in_flight = len(self._slots)
        return m

    # ---------------------------------------------------------------- consumer side
    async def take(self, version: int, timeout: float) -> list[list[Sample]]:
        """The next batch of ``B`` groups for the trainer (waits at most ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            if self._error is not None:
                raise RuntimeError(f"rollout producer failed: {self._error!r}") from self._error
            left = deadline - time.monotonic()
            groups = await self.buffer.atake(self.batch, version, timeout=max(min(left, 1.0), 0.0))
            if len(groups) == self.batch:
                break
            self.buffer.put_front(groups)
            if left <= 0:
                running = sum(1 for g in self._slots.values() if g is None)
                raise TimeoutError(
                    f"waited {timeout:.0f}s (--async-timeout) for a batch of {self.batch} groups; the buffer has "
                    f"{len(self.buffer)}, {running} are generating, {len(self._slots) - running} finished but "
                    f"wait for earlier ones; admission is {'open' if self._may_admit() else 'closed'}")
        self.consumed += self.batch
        self._trace_taken(groups, self.consumed // self.batch - 1)
        self._wake.set()
        return groups

    def weights_synced(self, steps: int) -> None:
        """The engines now hold the weights after ``steps`` rollout steps of training."""
        self.synced_steps = steps
        self._wake.set()

    # ---------------------------------------------------------------- pauses
    async def drain(self, timeout: float) -> None:
        """Close admission and wait until no admitted sample is generating (the one-step-off weight update: every
        sample's tokens then come from one version). Reward and tool waits of finished samples go on meanwhile."""
        self._admitting = False
        try:
            await asyncio.wait_for(self._generated.wait(), timeout)
        except asyncio.TimeoutError:
            self.resume()
            raise TimeoutError(f"waited {timeout:.0f}s (--async-timeout) for the generation of {len(self._generating)} "
                               f"admitted groups to finish before a weight update") from None
        except BaseException:
            self.resume()
            raise

    def resume(self) -> None:
        self._admitting = True
        self._wake.set()

    async def _wait_idle(self, timeout: float, what: str) -> None:
        tasks = list(self._tasks.values())
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            raise TimeoutError(f"waited {timeout:.0f}s (--async-timeout) for {what}; {len(pending)} still running")

    async def quiesce(self, timeout: float) -> None:
        """Stop admission and in-flight requests, and hand every untrained group back to the DataSource."""
        self._admitting = False
        await self.engine.abort_kind("train")
        await self._wait_idle(timeout, "in-flight rollouts to stop for a checkpoint")
        pipeline = self.buffer.clear() + [self._slots[k] for k in sorted(self._slots)]
        self._slots.clear()
        self._next_release = self._next_seq
        self.data.put_back(pipeline)

    async def stop(self) -> None:
        self._admitting = False
        if self._loop_task is not None:
            self._loop_task.cancel()
        for t in list(self._tasks.values()):
            t.cancel()
        tasks = list(self._tasks.values()) + ([self._loop_task] if self._loop_task else [])
        await asyncio.gather(*tasks, return_exceptions=True)

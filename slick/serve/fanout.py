"""The prompts or choices of one request run as a unit: checked together, started together, stopped together.

An OpenAI request with ``n = 64`` (or a batched ``/generate``) becomes many engine requests. If one of them is
refused after the others started (a seed out of range in choice 63), answering 400 while the other 63 keep
generating leaves work nobody will read. :func:`generate_all` therefore checks the sampling settings of every
choice (:func:`slick.engine.sampling.validate_sampling`) before starting any, and :func:`run_together` stops
every other one (``engine.abort`` by request id, then a cancel) as soon as one fails, and waits for them to end
before it raises (a caller that goes away cancels them all, as with ``asyncio.gather``).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Awaitable, Callable, Optional, Sequence

from slick.engine.sampling import validate_sampling

log = logging.getLogger("slick.engine")

STOP_WAIT_S = 10.0       # how long stopped choices get to end before run_together raises anyway


async def generate_all(engine: Any, jobs: Sequence[tuple[list[int], Any]], where: str = "choice",
                       on_cancel: Optional[Callable[[int], None]] = None) -> list:
    """``engine.generate(ids, sampling)`` for every ``(ids, sampling)`` of ``jobs``, as one unit (module doc);
    ``on_cancel`` as in :func:`run_together`.

    Raises :class:`slick.engine.sampling.SamplingError` naming ``where[i].field`` before any job starts when a
    job's settings are invalid; returns the Generations in order."""
    for i, (_, sp) in enumerate(jobs):
        validate_sampling(sp, f"{where}[{i}]")
    base = uuid.uuid4().hex
    rids = [f"{base}-{i}" for i in range(len(jobs))]
    abort = getattr(engine, "abort", None)
    return await run_together([engine.generate(list(ids), sp, rid=rid) for (ids, sp), rid in zip(jobs, rids)],
                              stop=(lambda i: abort(rids[i])) if abort is not None else None, on_cancel=on_cancel)


async def run_together(aws: Sequence[Awaitable], stop: Optional[Callable[[int], Awaitable]] = None,
                       on_cancel: Optional[Callable[[int], None]] = None) -> list:
    """Await every awaitable of ``aws``; return their results in order. When one raises, ``stop(i)`` each
    unfinished one (e.g. ``engine.abort(rid)``: its slot is freed at once), cancel them, wait (up to
    ``STOP_WAIT_S``) for them to end, and re-raise. When this call is cancelled, the unfinished ones are cancelled
    and waited for (``on_cancel(k)`` hears how many: a client that went away). Unlike ``asyncio.gather``, no
    sibling outlives the failure."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:      # the caller went away: a cancel stops each (as asyncio.gather does)
        if on_cancel is not None:
            on_cancel(sum(not t.done() for t in tasks))
        await _stop(tasks, None)
        raise
    failed = next((t for t in tasks if t.done() and (t.cancelled() or t.exception() is not None)), None)
    if failed is None:
        return [t.result() for t in tasks]
    await _stop(tasks, stop)
    if failed.cancelled():
        raise asyncio.CancelledError()
    raise failed.exception()


async def _stop(tasks: list, stop: Optional[Callable[[int], Awaitable]]) -> None:
    pending = [i for i, t in enumerate(tasks) if not t.done()]
    if stop is not None and pending:
        results = await asyncio.gather(*(stop(i) for i in pending), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                log.warning("stopping a request of a failed batch: %s: %s", type(r).__name__, r)
    for i in pending:
        tasks[i].cancel()
    if pending:
        await asyncio.wait([tasks[i] for i in pending], timeout=STOP_WAIT_S)
    for t in tasks:                   # retrieved: a second failure is not logged as "never retrieved"
        if t.done() and not t.cancelled():
            t.exception()

"""The plumbing of one HttpEngine request: a worker error worth retrying elsewhere, a streamed request in flight
(the tokens received so far, for a resubmission that continues them), waiting unless the health monitor gives a
worker up, URL normalisation and the message of a worker's error body."""
from __future__ import annotations

import asyncio
import json

from slick.types import Generation


class Retryable(Exception):
    """A worker failed in a way another worker may not (no connection, a 5xx, given up): try the next one."""


class Flight:
    """One streaming request: where it went, an event set when that worker failed, the last partial chunk."""

    def __init__(self, url: str, lost: asyncio.Event):
        self.url, self.lost = url, lost
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.gap = False                  # a chunk was missed: later ones are not kept

    def extend(self, gen: Generation, offset: int) -> None:
        if self.gap or offset != len(self.tokens):
            self.gap = True
            return
        self.tokens += gen.token_ids
        self.logprobs += gen.logprobs
        self.versions += gen.weight_versions or [gen.weight_version] * len(gen.token_ids)

    def received(self) -> tuple[list, list, list]:
        return list(self.tokens), list(self.logprobs), list(self.versions)


class Failed:
    """A worker that failed one request, and why (the error a caller reports when no worker answers)."""

    def __init__(self, url: str, error: str):
        self.url, self.error = url, error


async def unless(coro, event: asyncio.Event):
    """Await ``coro`` unless ``event`` is set first; then cancel it and raise Retryable."""
    task = asyncio.ensure_future(coro)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - it was given up
        pass
    raise Retryable("its worker was declared failed by the health monitor")


def norm_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def error_message(text: str) -> str:
    try:
        d = json.loads(text)
        if isinstance(d, dict):
            if "error" in d:
                e = d["error"]
                return e.get("message", str(e)) if isinstance(e, dict) else str(e)
            if "message" in d:
                return str(d["message"])
    except ValueError:
        pass
    return text[:300]

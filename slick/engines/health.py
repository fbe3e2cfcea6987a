"""Engine health monitor: notices a worker that died or hung, and says so at once.

    monitor = HealthMonitor(urls=lambda: engine.control_urls, processes=lambda: {url: proc},
                            on_failure=recovery.failed, interval=10, timeout=30, first_wait=0)
    monitor.start()           # an asyncio task on the running loop
    ...
    await monitor.stop()

Two checks, both bounded:

* **process** (every ``poll`` seconds, for the processes slick launched): a worker whose process exited is
  reported with its pid and exit signal ("killed by SIGKILL").
* **health** (``--use-fault-tolerance``; every ``interval`` seconds after ``first_wait``): ``GET
  /health_generate`` (a real one-token generation) on every URL; no answer within ``timeout`` seconds (a hung
  or stopped worker), a refused connection or an error status is a failure.

Each URL is reported once (``on_failure(url, reason)``); a URL that leaves ``urls()`` is forgotten.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Optional

import aiohttp

from slick.engines.fault import exit_description

log = logging.getLogger("slick.engine")


class HealthMonitor:
    """Watches worker processes and ``/health_generate`` (module doc)."""

    def __init__(self, urls: Callable[[], list], on_failure: Callable[[str, str], Awaitable[None]], *,
                 processes: Optional[Callable[[], dict]] = None, interval: float = 10.0, timeout: float = 30.0,
                 first_wait: float = 0.0, health_checks: bool = True, poll: float = 0.5,
                 paused: Optional[Callable[[], bool]] = None, path: str = "/health_generate"):
        self.urls, self.on_failure = urls, on_failure
        self.path = path                                # the route that proves a worker generates
        self.processes = processes or (lambda: {})
        self.interval, self.timeout, self.first_wait = float(interval), float(timeout), float(first_wait)
        self.health_checks, self.poll = bool(health_checks), float(poll)
        self.paused = paused or (lambda: False)     # health checks wait while this is true (e.g. a weight sync)
        self.reported: set[str] = set()
        self.checks = 0                                # /health_generate calls made (for tests and logs)
        self._task: Optional[asyncio.Task] = None
        self._probes: dict[str, asyncio.Task] = {}
        self._session: Optional[aiohttp.ClientSession] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self._probes.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task, self._probes = None, {}
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        next_check = time.monotonic() + self.first_wait
        while True:
            live = set(self.urls())
            self.reported &= live | set(self.processes())
            for url, proc in list(self.processes().items()):
                if url not in self.reported and not proc.alive():
                    rc = proc.proc.returncode if hasattr(proc, "proc") else None
                    await self._report(url, f"its process exited: {exit_description(rc)}")
            now = time.monotonic()
            if self.health_checks and now >= next_check and not self.paused():
                next_check = now + self.interval
                for url in live - self.reported:
                    if url not in self._probes:
                        self._probes[url] = asyncio.ensure_future(self._probe(url))
            await asyncio.sleep(self.poll)

    async def _report(self, url: str, reason: str) -> None:
        if url in self.reported:
            return
        self.reported.add(url)
        try:
            await self.on_failure(url, reason)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the monitor keeps watching the others
            log.exception("handling the failure of engine worker %s failed", url)

    async def _probe(self, url: str) -> None:
        try:
            reason = await self.check(url)
            if reason is not None and url in self.urls():
                await self._report(url, reason)
        finally:
            self._probes.pop(url, None)

    async def check(self, url: str) -> Optional[str]:
        """None when ``url`` answers ``GET /health_generate`` with 200 within the timeout, else why not."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        self.checks += 1
        try:
            async with self._session.get(url + self.path,
                                         timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                if resp.status == 200:
                    return None
                return f"{self.path} answered HTTP {resp.status}: {(await resp.text())[:200]}"
        except asyncio.TimeoutError:
            return f"no answer to {self.path} within {self.timeout:g}s (--rollout-health-check-timeout): hung"
        except (aiohttp.ClientError, OSError) as e:
            return f"{self.path} failed: {type(e).__name__}: {e}"

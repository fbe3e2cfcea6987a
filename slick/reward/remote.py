"""``remote_rm``: score a sample by POSTing it to a reward-model HTTP server.

Request body: ``{"prompt": ..., "response": ..., "label": ...}`` (JSON; non-JSON labels are sent
as ``str(label)``). Accepted replies: a JSON number, ``{"reward": <number or dict>}``, or any
other JSON object, which becomes a dict reward (pick its scalar with ``--reward-key``).

Each attempt has its own ``timeout`` (seconds). Connection errors, timeouts and 5xx replies are
retried up to ``max_retries`` times with exponential backoff (``backoff * 2**attempt`` seconds,
capped at ``max_backoff``); 4xx replies, malformed bodies and non-finite numbers fail at once
(the last as :class:`~slick.reward.errors.NonFiniteRewardError`, which the hub counts in
``reward/nonfinite``).

A server that is down (refused connections, timeouts, 5xx) is ridden out for as long as the
retries last (:meth:`RemoteRM.retry_window_seconds`: about 3.5 s with the defaults, about 40 s
with ``--rm-max-retries 8``). The client tracks outages: the first failure after a success
logs one warning naming the URL, the first success after it logs how long the server was away,
and a call that gives up logs the URL, the attempts and the last error; the sample then gets
``--rm-failure-reward`` from the hub. Pooled keep-alive connections to a restarted server fail
once (``ServerDisconnectedError``) and are retried on a fresh connection, so a server that comes
back on the same URL is used again without restarting the run. Counters: :meth:`RemoteRM.stats`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any, Optional, Union

import aiohttp

from slick.reward.errors import NonFiniteRewardError

logger = logging.getLogger(__name__)

Reward = Union[float, dict]


class RemoteRewardError(RuntimeError):
    """A remote reward call failed for good; ``timed_out`` tells whether the last try timed out."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def parse_reply(body: Any) -> Reward:
    """Turn a reward server's JSON reply into a float or dict reward (``ValueError`` if neither)."""
    if isinstance(body, dict) and set(body) == {"reward"}:
        body = body["reward"]
    if isinstance(body, bool) or not isinstance(body, (int, float, dict)):
        raise ValueError(f"reward server reply must be a number or an object, got {str(body)[:120]!r}")
    if isinstance(body, dict):
        return body
    return float(body)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


class RemoteRM:
    """A pooled aiohttp client for one reward server URL.

    Bind it to one event loop: the session is created lazily inside the loop that first calls
    :meth:`score` and must be closed with :meth:`close` in that same loop.
    """

    def __init__(self, url: str, timeout: float = 30.0, max_retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 8.0, max_connections: int = 64):
        if not url:
            raise ValueError("remote_rm needs --rm-url")
        self.url = url
        self.timeout = float(timeout)
        self.max_retries = max(0, int(max_retries))
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.max_connections = max_connections
        self.retries = 0            # retried attempts since start (for stats)
        self.giveups = 0            # calls that failed for good after their retries
        self.outages = 0            # times the server went from answering to failing
        self.recoveries = 0         # times it answered again after an outage
        self.down_seconds = 0.0     # total time between an outage's first failure and its recovery
        self._down_since: Optional[float] = None
        self._session: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def worst_case_seconds(self) -> float:
        """Upper bound of one :meth:`score` call: every attempt times out plus all backoffs."""
        return self.timeout * (self.max_retries + 1) + self.retry_window_seconds()

    def retry_window_seconds(self) -> float:
        """How long an unreachable server (connections refused at once) is retried before a call gives up."""
        return sum(min(self.backoff * 2 ** k, self.max_backoff) for k in range(self.max_retries))

    def stats(self) -> dict:
        """Outage counters since start: retries, give-ups, outages, recoveries, seconds down (so far)."""
        down = self.down_seconds + (time.monotonic() - self._down_since if self._down_since is not None else 0.0)
        return {"reward/remote_retries": self.retries, "reward/remote_giveups": self.giveups,
                "reward/remote_outages": self.outages, "reward/remote_recoveries": self.recoveries,
                "reward/remote_down_s": down}

    def _failed_attempt(self, error: str) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            self.outages += 1
            logger.warning("reward server %s is failing (%s); retrying each call up to %d times "
                           "(about %.1f s when connections are refused)", self.url, error,
                           self.max_retries, self.retry_window_seconds())

    def _answered(self) -> None:
        if self._down_since is not None:
            away = time.monotonic() - self._down_since
            self.down_seconds += away
            self.recoveries += 1
            self._down_since = None
            logger.warning("reward server %s answers again after %.1f s", self.url, away)

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session from an earlier (now finished) event loop cannot be reused or closed here.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.timeout))
            self._loop = loop
        return self._session

    async def score(self, prompt: Any, response: str, label: Any) -> Reward:
        """POST one sample and return its reward; raises :class:`RemoteRewardError` after the last try
        (:class:`NonFiniteRewardError` at once for a NaN or infinite number)."""
        payload = {"prompt": _jsonable(prompt), "response": response, "label": _jsonable(label)}
        session = self._get_session()
        last_error, timed_out, t0 = "", False, time.monotonic()
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            try:
                async with session.post(self.url, json=payload) as resp:
                    text = await resp.text()
                    if resp.status >= 500:
                        last_error, timed_out = f"HTTP {resp.status}: {text[:200]}", False
                        self._failed_attempt(last_error)
                        continue
                    self._answered()
                    if resp.status >= 400:
                        raise RemoteRewardError(f"reward server {self.url} answered HTTP {resp.status}: {text[:200]}")
                    try:
                        reward = parse_reply(json.loads(text))
                    except (json.JSONDecodeError, ValueError) as e:
                        raise RemoteRewardError(f"reward server {self.url} sent a bad reply: {e}") from None
                    if isinstance(reward, float) and not math.isfinite(reward):
                        raise NonFiniteRewardError(f"reward server {self.url} sent a non-finite reward {reward}")
                    return reward
            except asyncio.TimeoutError:
                last_error, timed_out = f"no reply within {self.timeout:g}s", True
            except aiohttp.ClientError as e:   # connection refused/reset, server disconnected, ...
                last_error, timed_out = f"{type(e).__name__}: {e}", False
            self._failed_attempt(last_error)
            logger.debug("remote reward attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, last_error)
        self.giveups += 1
        raise RemoteRewardError(f"reward server {self.url} failed after {self.max_retries + 1} attempts "
                                f"(retried for {time.monotonic() - t0:.1f} s): {last_error}", timed_out=timed_out)

    async def close(self) -> None:
        """Close the HTTP session (call from the event loop that used it)."""
        if self._session is not None and not self._session.closed:
            try:
                if self._loop is asyncio.get_running_loop():
                    await self._session.close()
            except RuntimeError:
                pass
        self._session = None
        self._loop = None

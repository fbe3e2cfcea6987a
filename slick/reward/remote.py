"""``remote_rm``: score a sample by POSTing it to a reward-model HTTP server.

Request body: ``{"prompt": ..., "response": ..., "label": ...}`` (JSON; non-JSON labels are sent
as ``str(label)``). Accepted replies: a JSON number, ``{"reward": <number or dict>}``, or any
other JSON object, which becomes a dict reward (pick its scalar with ``--reward-key``).

Each attempt has its own ``timeout`` (seconds). Connection errors, timeouts and 5xx replies are
retried up to ``max_retries`` times with exponential backoff (``backoff * 2**attempt`` seconds,
capped at ``max_backoff``); 4xx replies, malformed bodies and non-finite numbers fail at once
(the last as :class:`~slick.reward.errors.NonFiniteRewardError`, which the hub counts in
``reward/nonfinite``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
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
        self._session: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def worst_case_seconds(self) -> float:
        """Upper bound of one :meth:`score` call: every attempt times out plus all backoffs."""
        waits = sum(min(self.backoff * 2 ** k, self.max_backoff) for k in range(self.max_retries))
        return self.timeout * (self.max_retries + 1) + waits

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
        last_error, timed_out = "", False
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(min(self.backoff * 2 ** (attempt - 1), self.max_backoff))
            try:
                async with session.post(self.url, json=payload) as resp:
                    text = await resp.text()
                    if resp.status >= 500:
                        last_error, timed_out = f"HTTP {resp.status}: {text[:200]}", False
                        continue
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
            logger.debug("remote reward attempt %d/%d failed: %s", attempt + 1, self.max_retries + 1, last_error)
        raise RemoteRewardError(f"reward server {self.url} failed after {self.max_retries + 1} attempts: "
                                f"{last_error}", timed_out=timed_out)

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

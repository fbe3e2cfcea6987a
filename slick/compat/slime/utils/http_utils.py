"""slime's HTTP helpers for plug-ins: ``await post(url, payload)`` and ``await get(url)`` return the JSON answer.

A connection that cannot be made is retried (``max_retries`` times, 0.5 s apart: an engine may be restarting);
an answer with an HTTP error status raises ``RuntimeError`` with the status and the server's message.
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

import aiohttp

TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30)


async def _call(method: str, url: str, payload: Any = None, max_retries: int = 60,
                headers: Optional[dict] = None) -> Any:
    for attempt in range(max(1, max_retries)):
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                async with session.request(method, url, json=payload, headers=headers) as r:
                    body = await r.text()
                    if r.status >= 400:
                        raise RuntimeError(f"{method} {url}: HTTP {r.status}: {body[:500]}")
                    return await r.json(content_type=None) if body else None
        except aiohttp.ClientConnectionError:
            if attempt + 1 >= max(1, max_retries):
                raise
            await asyncio.sleep(0.5)


async def post(url: str, payload: Any, max_retries: int = 60, headers: Optional[dict] = None) -> Any:
    return await _call("POST", url, payload, max_retries, headers)


async def get(url: str) -> Any:
    return await _call("GET", url)

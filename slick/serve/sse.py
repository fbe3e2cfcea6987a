"""Named server-sent events (``event: NAME`` + ``data: JSON``), as the Responses and Messages APIs stream them."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from slick.serve.http_body import dumps


async def send_events(request: web.Request, events: list[tuple[str, Any]]) -> web.StreamResponse:
    """Write ``events`` (``(name, payload)``) as one ``text/event-stream`` answer and end it."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for name, payload in events:
        await resp.write(f"event: {name}\ndata: {dumps(payload)}\n\n".encode())
    await resp.write_eof()
    return resp

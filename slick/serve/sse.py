"""Named server-sent events (``event: NAME`` + ``data: JSON``), as the Responses and Messages APIs stream them.

:class:`ChunkEvents` is the writer the chat streamer (``openai_stream.Streamer``) writes its chat-completion
chunks to when ``/v1/responses`` or ``/v1/messages`` streams: it has :class:`openai_stream.SSEWriter`'s interface
(``resp``, ``open``, ``send``, ``close``) and turns each chunk, as it comes, into the other API's events. So those
APIs stream token by token through the one chat decoder (held-back stop strings, tool calls, aborts on
disconnect), and a subclass only says which events a text delta, the tool calls, the usage and the end make.
"""
from __future__ import annotations

from typing import Optional

from aiohttp import web

from slick.serve.http_body import dumps

Events = list[tuple[str, dict]]


class ChunkEvents:
    """Chat chunks in, named events out (module doc). Subclasses implement the ``on_*`` hooks; each returns the
    events to send now. Only choice 0 is read (the Responses and Messages APIs have one choice)."""

    def __init__(self, request: web.Request):
        self.request = request
        self.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        self.finish_reason: Optional[str] = None
        self.usage: Optional[dict] = None
        self.failed = False

    async def open(self) -> None:
        await self.resp.prepare(self.request)
        await self._write(self.on_open())

    async def send(self, chunk: dict) -> None:
        """One chat chunk (or the ``{"error": ...}`` object the streamer sends when the call fails)."""
        if "error" in chunk:
            self.failed = True
            await self._write(self.on_error(chunk["error"]))
            return
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        events: Events = []
        for ch in chunk.get("choices") or []:
            if ch.get("index", 0) != 0:
                continue
            delta = ch.get("delta") or {}
            if delta.get("content"):
                events += self.on_text(delta["content"])
            if delta.get("tool_calls"):
                events += self.on_calls(delta["tool_calls"])
            if ch.get("finish_reason"):
                self.finish_reason = ch["finish_reason"]
        await self._write(events)

    async def close(self) -> web.StreamResponse:
        if not self.failed:
            await self._write(self.on_close())
        await self.resp.write_eof()
        return self.resp

    async def _write(self, events: Events) -> None:
        if events:
            await self.resp.write("".join(f"event: {name}\ndata: {dumps(payload)}\n\n"
                                          for name, payload in events).encode())

    # ------------------------------------------------------------ the API's events
    def on_open(self) -> Events:
        raise NotImplementedError

    def on_text(self, text: str) -> Events:
        raise NotImplementedError

    def on_calls(self, calls: list[dict]) -> Events:
        """The tool calls of the answer (chat ``tool_calls`` deltas: ``id``, ``function.name``, whole
        ``function.arguments``), sent once they parsed."""
        raise NotImplementedError

    def on_close(self) -> Events:
        """The end of a stream that did not fail (``finish_reason`` and ``usage`` are known)."""
        raise NotImplementedError

    def on_error(self, error: dict) -> Events:
        raise NotImplementedError


class LeadingSpace:
    """Text held back while it is only whitespace, when the answer may be tool calls (``hold``): the unstreamed
    answer then drops whitespace before them (its ``content`` is null), so a stream opens its text part only once
    something else arrived."""

    def __init__(self, hold: bool):
        self.held = ""
        self.open = not hold

    def feed(self, text: str) -> str:
        """What to send of ``text`` now ("" while only whitespace has come)."""
        if self.open:
            return text
        self.held += text
        if not self.held.strip():
            return ""
        self.open, out, self.held = True, self.held, ""
        return out

    def rest(self, calls: bool) -> str:
        """At the end: the held whitespace, unless the answer was tool calls."""
        out, self.held = ("" if calls else self.held), ""
        return out


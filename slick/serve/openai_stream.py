"""Server-sent events for ``/v1/chat/completions`` and ``/v1/completions`` with ``"stream": true``.

Every choice's engine request is started with a known request id; every ``STREAM_EVERY_S`` seconds the tokens
each has sampled so far are read (``engine.partial``, which slick's LocalEngine has; an engine without it, such
as an HTTP client in an agent rollout, streams its whole answer in the final chunk) and the new text goes out as
a delta. Text that may still turn out to be part of a stop string, an incomplete UTF-8 character, the newest
token (it may be the stop token) and, when tools are given, anything from a (possible) ``<tool_call>`` on is
held back until the choice ends. The end of a choice is answered from the same final result as an unstreamed
request (:meth:`OpenAIEndpoint._chat_result`): the rest of the text, the tool calls as ``tool_calls`` deltas
(one per call, with its id, name and whole ``arguments``), the remaining logprobs and the finish reason. So the
concatenated deltas equal the unstreamed answer, and an agent session records a streamed call exactly as an
unstreamed one. (Whitespace that the unstreamed ``content`` strips around tool calls may have been streamed.)

With ``stream_options.include_usage`` every chunk carries ``"usage": null`` and a last chunk with no choices
carries the usage. The stream ends with ``data: [DONE]``. An error after the stream began is sent as an event
``{"error": {...}}`` (what the ``openai`` client raises on). A client that disconnects (the write fails, or its
handler is cancelled) stops every engine request of its call, all ``n`` choices: each is cancelled at once (the
engine drops it at its next step and counts it as aborted) and ``engine.abort(rid)`` is sent too.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Optional

from aiohttp import web

from slick.engine.sampling import validate_sampling
from slick.serve.http_body import dumps
from slick.serve.openai_protocol import completion_logprobs, token_logprobs

log = logging.getLogger("slick.openai")

STREAM_EVERY_S = 0.05        # how often the tokens so far are read and sent
STOP_WAIT_S = 10.0
TOOL_OPEN = "<tool_call>"


def held_back(text: str, stops: list[str], hold_tool: bool) -> str:
    """The part of ``text`` (decoded so far) that is sure to stay in the final answer."""
    text = text.rstrip("\ufffd")                          # an incomplete UTF-8 character
    cut = len(text)
    for s in list(stops) + ([TOOL_OPEN] if hold_tool else []):
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
        for k in range(min(len(s) - 1, len(text)), 0, -1):     # a suffix that may grow into ``s``
            if text.endswith(s[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]


class ChoiceState:
    """What has been sent of one choice: its text and how many tokens' logprobs."""

    def __init__(self):
        self.text = ""
        self.n_logprobs = 0
        self.done = False


class SSEWriter:
    """An open ``text/event-stream`` answer."""

    def __init__(self, request: web.Request):
        self.request = request
        self.resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    async def open(self) -> None:
        await self.resp.prepare(self.request)

    async def send(self, obj: Any) -> None:
        await self.resp.write(f"data: {dumps(obj)}\n\n".encode())

    async def close(self) -> web.StreamResponse:
        await self.resp.write(b"data: [DONE]\n\n")
        await self.resp.write_eof()
        return self.resp


async def run_polled(engine: Any, jobs: list, on_progress: Callable[[int, tuple], Awaitable[None]],
                     every: float = STREAM_EVERY_S, on_disconnect: Optional[Callable[[int], None]] = None) -> list:
    """``engine.generate`` for each ``(ids, sampling)`` of ``jobs`` (checked first, as ``generate_all`` does),
    calling ``on_progress(i, (tokens, logprobs, versions, tops))`` with choice ``i``'s tokens so far every
    ``every`` seconds; returns the Generations. Any failure, cancel or disconnect stops every unfinished one;
    ``on_disconnect(k)`` hears how many were stopped because the client went away (a cancel or a failed write)."""
    for i, (_, sp) in enumerate(jobs):
        validate_sampling(sp, f"choice[{i}]")
    base = uuid.uuid4().hex
    rids = [f"{base}-{i}" for i in range(len(jobs))]
    tasks = [asyncio.ensure_future(engine.generate(list(ids), sp, rid=rid)) for (ids, sp), rid in zip(jobs, rids)]
    partial = getattr(engine, "partial", None)
    try:
        while True:
            failed = next((t for t in tasks if t.done() and (t.cancelled() or t.exception() is not None)), None)
            if failed is not None:
                raise asyncio.CancelledError() if failed.cancelled() else failed.exception()
            pending = [t for t in tasks if not t.done()]
            if not pending:
                return [t.result() for t in tasks]
            await asyncio.wait(pending, timeout=every)
            for i, t in enumerate(tasks):
                if partial is not None and not t.done():
                    part = _partial(partial, rids[i])
                    if part is not None and part[0]:
                        await on_progress(i, part)
    except BaseException as e:
        stopped = cancel_pending(tasks)     # at once: a second cancel of this handler cannot leave one running
        if on_disconnect is not None and isinstance(e, (asyncio.CancelledError, ConnectionError)):
            on_disconnect(len(stopped))
        await _abort(engine, rids, tasks, stopped)
        raise


def _partial(partial, rid: str) -> Optional[tuple]:
    try:
        part = partial(rid, 0, tops=True)
    except TypeError:                      # an engine whose partial() has no ``tops``
        part = partial(rid, 0)
    return None if part is None else tuple(part) + (None,) * (4 - len(part))


def cancel_pending(tasks: list) -> list[int]:
    """Cancel every unfinished task of ``tasks`` (synchronously); return their indices. A cancelled
    ``engine.generate`` marks its request cancelled and the engine drops it at its next step."""
    pending = [i for i, t in enumerate(tasks) if not t.done()]
    for i in pending:
        tasks[i].cancel()
    return pending


async def _abort(engine: Any, rids: list[str], tasks: list, pending: list[int]) -> None:
    """Also ask the engine to abort the cancelled ones (an HTTP engine's server frees their slots now), then wait
    (bounded) for them to end."""
    abort = getattr(engine, "abort", None)
    if abort is not None and pending:
        res = await asyncio.gather(*(abort(rids[i]) for i in pending), return_exceptions=True)
        for r in res:
            if isinstance(r, Exception):
                log.warning("aborting a streamed request: %s: %s", type(r).__name__, r)
    if pending:
        await asyncio.wait([tasks[i] for i in pending], timeout=STOP_WAIT_S)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()


class Streamer:
    """One streamed call: ``kind`` "chat" or "completion"; ``head`` the fields of every chunk (id, object,
    created, model); ``tok`` the tokenizer; ``stops`` the stop strings; ``hold_tool`` whether calls may come;
    ``sse`` where the chunks go (an :class:`SSEWriter` by default; ``slick.serve.sse.ChunkEvents`` for the
    Responses and Messages APIs, which turn the same chunks into their own events)."""

    def __init__(self, request: web.Request, kind: str, head: dict, tok, params, stops: list[str],
                 hold_tool: bool, n: int, sse=None):
        self.sse = SSEWriter(request) if sse is None else sse     # or the Responses/Messages events (``sse``)
        self.kind, self.head, self.tok, self.params = kind, head, tok, params
        self.stops, self.hold_tool = stops, hold_tool
        self.next_prompt(n, 0)

    def next_prompt(self, n: int, index0: int) -> None:
        """Choices ``index0 .. index0 + n - 1`` (a batched ``/v1/completions`` streams one prompt after another)."""
        self.index0 = index0
        self.state = [ChoiceState() for _ in range(n)]

    def chunk(self, choices: list, **extra) -> dict:
        out = {**self.head, "choices": choices, **extra}
        if self.kind == "chat":
            out["system_fingerprint"] = None
        if self.params.include_usage and "usage" not in out:
            out["usage"] = None
        return out

    async def start(self) -> None:
        await self.sse.open()
        if self.kind == "chat":
            await self.sse.send(self.chunk([{"index": self.index0 + i, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}
                                            for i in range(len(self.state))]))

    def _logprobs(self, st: ChoiceState, ids, lps, tops, upto: int) -> Optional[dict]:
        if not self.params.logprobs or upto <= st.n_logprobs:
            return None
        a = st.n_logprobs
        t = None if tops is None else tops[a:upto]
        st.n_logprobs = upto
        if self.kind == "chat":
            return {"content": token_logprobs(self.tok, ids[a:upto], lps[a:upto], t), "refusal": None}
        return completion_logprobs(self.tok, ids[a:upto], lps[a:upto], t, offset=len(st.text))

    async def progress(self, i: int, part: tuple) -> None:
        """Send what choice ``i`` surely keeps of its tokens so far (all but the newest)."""
        ids, lps, _, tops = part
        st = self.state[i]
        sure = ids[:-1]
        text = held_back(self.tok.decode(sure, skip_special_tokens=True), self.stops, self.hold_tool)
        delta = text[len(st.text):] if text.startswith(st.text) else ""
        lp = self._logprobs(st, ids, lps, tops, len(sure))
        if delta or lp:
            await self.sse.send(self.chunk([self._choice(i, delta, lp, None)]))
            st.text += delta

    def _choice(self, i: int, text: str, lp: Optional[dict], finish: Optional[str], calls=None) -> dict:
        if self.kind == "chat":
            delta = {"content": text} if text else {}
            if calls:
                delta["tool_calls"] = calls
            return {"index": self.index0 + i, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"index": self.index0 + i, "text": text, "logprobs": lp, "finish_reason": finish}

    async def finish(self, i: int, gen, final: dict, n_text: int) -> None:
        """The end of choice ``i`` from its unstreamed answer ``final`` (a chat or completion choice)."""
        st = self.state[i]
        full = (final["message"].get("content") or "") if self.kind == "chat" else final["text"]
        if full.startswith(st.text):
            rest = full[len(st.text):]
        else:
            rest = ""
            log.warning("streamed text of choice %d is not a prefix of its final text; the rest is dropped", i)
        lp = self._logprobs(st, list(gen.token_ids), list(gen.logprobs), gen.top_logprobs, n_text)
        calls = None
        if self.kind == "chat" and final["message"].get("tool_calls"):
            calls = [{"index": k, **c} for k, c in enumerate(final["message"]["tool_calls"])]
        await self.sse.send(self.chunk([self._choice(i, rest, lp, final["finish_reason"], calls)]))
        st.text += rest
        st.done = True

    async def end(self, usage: dict) -> web.StreamResponse:
        if self.params.include_usage:
            await self.sse.send({**self.chunk([]), "usage": usage})
        return await self.sse.close()

    async def error(self, message: str, type: str = "server_error") -> web.StreamResponse:
        await self.sse.send({"error": {"message": message, "type": type, "param": None, "code": None}})
        return await self.sse.close()


def head(kind: str, model: str) -> dict:
    """The fields every chunk of one streamed call shares."""
    obj, prefix = ("chat.completion.chunk", "chatcmpl") if kind == "chat" else ("text_completion", "cmpl")
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()), "model": model}

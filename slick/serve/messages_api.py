"""Anthropic's Messages API, ``POST /v1/messages``, translated to and from the chat path of ``openai_api``.

So agents written for Claude (the ``anthropic`` client, or slime's adapters) can be served and trained. Honoured:
``messages`` (string content or blocks: ``text``, ``tool_use``, ``tool_result``), ``system`` (a string or text
blocks), ``max_tokens`` (required, as in Anthropic's API), ``tools`` (``name``, ``description``,
``input_schema``), ``tool_choice`` (``auto``, ``any`` = OpenAI's "required", ``tool`` = a named function, ``none``;
forced by grammar), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``stream``, ``output_config``
(``format`` ``json_schema``: structured output by grammar, as the chat path's ``response_format``; its other keys
are refused). Accepted and ignored:
``metadata``, ``service_tier``, ``model``. Refused by name: ``thinking`` when enabled, image/document blocks.
Answers: ``content`` blocks (``text``, then one ``tool_use`` per call with ``input`` an object), ``stop_reason``
(``end_turn``, also when a stop sequence matched; ``max_tokens``, ``tool_use``) and ``usage``. Errors use Anthropic's shape
``{"type": "error", "error": {"type", "message"}}``.

With ``"stream": true`` the answer streams token by token through the chat endpoint's streamer
(``openai_stream``; :class:`MessageEvents` turns its chunks into events): ``message_start``, a text block
(``content_block_start``, one ``content_block_delta`` ``text_delta`` per piece of text as the engine samples it,
``content_block_stop``), one ``tool_use`` block per call once it parsed (text from a possible ``<tool_call>`` on
is held back; its ``input_json_delta`` carries the whole input), ``message_delta`` (stop reason, output tokens)
and ``message_stop``. A failure after the stream began is an ``error`` event. A client that disconnects aborts
its generation.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Optional

from aiohttp import web

from slick.serve.http_body import BodyError, json_response, read_json
from slick.serve.openai_protocol import OpenAIError, parse_tools
from slick.serve.sse import ChunkEvents, LeadingSpace

IGNORED = {"model", "metadata", "service_tier", "container", "mcp_servers"}
KNOWN = {"messages", "system", "max_tokens", "tools", "tool_choice", "stop_sequences", "temperature", "top_p",
         "top_k", "stream", "thinking", "output_config"}


def _error(message: str, status: int = 400) -> web.Response:
    kind = {404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "api_error")
    return json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _blocks_text(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise OpenAIError(f"{where} must be a string or a list of content blocks", param=where)
    out = []
    for i, b in enumerate(blocks):
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
            out.append(b["text"])
        else:
            raise OpenAIError(f"{where}[{i}]: only text blocks are supported here", param=where)
    return "".join(out)


def _message(m: Any, i: int) -> list[dict]:
    where = f"messages[{i}]"
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise OpenAIError(f"{where} must have role \"user\" or \"assistant\"", param=where)
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise OpenAIError(f"{where}.content must be a string or a list of blocks", param=where)
    out, text, calls = [], [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_use" and m["role"] == "assistant":
            calls.append({"id": str(b.get("id") or ""), "type": "function",
                          "function": {"name": b.get("name"), "arguments": b.get("input") or {}}})
        elif kind == "tool_result" and m["role"] == "user":
            c = b.get("content", "")
            out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""),
                        "content": _blocks_text(c, f"{where}.content[{j}].content")})
        else:
            raise OpenAIError(f"{where}.content[{j}]: block type {kind!r} is not supported (text, tool_use, "
                              "tool_result)", param=where)
    if m["role"] == "assistant":
        msg = {"role": "assistant", "content": "".join(text) if text or not calls else None}
        if calls:
            msg["tool_calls"] = calls
        return [msg]
    return out + ([{"role": "user", "content": "".join(text)}] if text else [])


def chat_body(body: Any) -> dict:
    """The ``/v1/chat/completions`` body equivalent to a Messages request (refusals name the field)."""
    if not isinstance(body, dict):
        raise OpenAIError("request body must be a JSON object")
    for k in body:
        if k not in KNOWN and k not in IGNORED:
            raise OpenAIError(f"{k}: Extra inputs are not permitted", param=k)
    if isinstance(body.get("thinking"), dict) and body["thinking"].get("type") == "enabled":
        raise OpenAIError("thinking: extended thinking is not supported by slick", param="thinking")
    if body.get("max_tokens") is None:
        raise OpenAIError("max_tokens: Field required", param="max_tokens")
    msgs = []
    if body.get("system"):
        msgs.append({"role": "system", "content": _blocks_text(body["system"], "system")})
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise OpenAIError("messages: must be a non-empty list", param="messages")
    for i, m in enumerate(body["messages"]):
        msgs += _message(m, i)
    out = {"messages": msgs, "max_tokens": body["max_tokens"]}
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or "type" in t and t["type"] != "custom":
            raise OpenAIError(f"tools[{i}]: only client tools {{'name', 'input_schema'}} are supported",
                              param=f"tools[{i}]")
        tools.append({"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                       "parameters": t.get("input_schema") or {"type": "object"}}})
    if tools:
        out["tools"] = tools
    tc = body.get("tool_choice")
    if tc is not None:
        kind = tc.get("type") if isinstance(tc, dict) else None
        mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
        if kind == "tool":
            mapped = {"type": "function", "function": {"name": tc.get("name")}}
        if mapped is None:
            raise OpenAIError(f"tool_choice {json.dumps(tc)[:80]}: type must be auto, any, tool or none",
                              param="tool_choice")
        out["tool_choice"] = mapped
        if isinstance(tc, dict) and tc.get("disable_parallel_tool_use"):
            out["parallel_tool_calls"] = False
    for src, dst in (("stop_sequences", "stop"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("top_k", "top_k")):
        if body.get(src) is not None:
            out[dst] = body[src]
    fmt = _output_format(body.get("output_config"))
    if fmt is not None:
        out["response_format"] = fmt
    return out


def _output_config_error(message: str) -> OpenAIError:
    return OpenAIError(f"output_config: {message}", param="output_config")


def _output_format(cfg: Any) -> Optional[dict]:
    """Anthropic's structured output, ``output_config: {"format": {"type": "json_schema", "schema": S}}``, as the
    chat ``response_format`` it means (the answer's text is JSON valid against ``S``); None when absent."""
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise _output_config_error("must be an object {\"format\": {\"type\": \"json_schema\", \"schema\": ...}}")
    extra = sorted(set(cfg) - {"format"})
    if extra:
        raise _output_config_error(f"{extra[0]} is not supported by slick (only format)")
    fmt = cfg.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise _output_config_error("format must be {\"type\": \"json_schema\", \"schema\": {...}}")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}


def message_object(body: dict, chat: dict) -> dict:
    """An Anthropic ``message`` from a chat answer."""
    ch = chat["choices"][0]
    msg = ch["message"]
    content = [{"type": "text", "text": msg["content"]}] if msg.get("content") else []
    content += [tool_use(c) for c in msg.get("tool_calls") or []]
    return {**message_shell(chat["model"], f"msg_{uuid.uuid4().hex}", chat["usage"]["prompt_tokens"],
                            chat["usage"]["completion_tokens"]),
            "content": content, "stop_reason": stop_reason(ch["finish_reason"])}


def tool_use(call: dict) -> dict:
    """A ``tool_use`` block from a chat tool call."""
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"), "name": call["function"]["name"],
            "input": json.loads(call["function"]["arguments"])}


def stop_reason(finish: str) -> str:
    # a stop string ends the turn as "end_turn": the chat answer does not say which one matched
    return {"tool_calls": "tool_use", "length": "max_tokens"}.get(finish, "end_turn")


def message_shell(model: str, msg_id: str, input_tokens: int, output_tokens: int) -> dict:
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


class MessageEvents(ChunkEvents):
    """Anthropic's streaming events from chat chunks (module doc)."""

    def __init__(self, request: web.Request, model: str, input_tokens: int, calls: bool):
        super().__init__(request)
        self.model, self.input_tokens = model, input_tokens
        self.index = 0                 # the next block's index
        self.text_open = False
        self.lead = LeadingSpace(calls)    # ``calls``: the answer is parsed for tool calls
        self.calls = False

    def on_open(self) -> list:
        msg = message_shell(self.model, f"msg_{uuid.uuid4().hex}", self.input_tokens, 0)
        return [("message_start", {"type": "message_start", "message": msg})]

    def _text(self, text: str) -> list:
        ev = []
        if not self.text_open:
            self.text_open = True
            ev.append(("content_block_start", {"type": "content_block_start", "index": self.index,
                                               "content_block": {"type": "text", "text": ""}}))
        return ev + [("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                              "delta": {"type": "text_delta", "text": text}})]

    def on_text(self, text: str) -> list:
        text = self.lead.feed(text)
        return self._text(text) if text else []

    def _end_text(self) -> list:
        if not self.text_open:
            return []
        self.text_open = False
        self.index += 1
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index - 1})]

    def on_calls(self, calls: list[dict]) -> list:
        self.calls = True
        self.lead.rest(calls=True)
        ev = self._end_text()
        for c in calls:
            block = tool_use(c)
            ev += [("content_block_start", {"type": "content_block_start", "index": self.index,
                                            "content_block": {**block, "input": {}}}),
                   ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": {
                       "type": "input_json_delta", "partial_json": c["function"]["arguments"]}}),
                   ("content_block_stop", {"type": "content_block_stop", "index": self.index})]
            self.index += 1
        return ev

    def on_close(self) -> list:
        rest = self.lead.rest(calls=self.calls)
        ev = (self._text(rest) if rest else []) + self._end_text()
        out = (self.usage or {}).get("completion_tokens", 0)
        return ev + [("message_delta", {"type": "message_delta", "delta": {
                         "stop_reason": stop_reason(self.finish_reason or "stop"), "stop_sequence": None},
                         "usage": {"output_tokens": out}}),
                     ("message_stop", {"type": "message_stop"})]

    def on_error(self, error: dict) -> list:
        return [("error", {"type": "error", "error": {"type": "api_error", "message": str(error.get("message"))}})]


class MessagesAPI:
    """``POST /v1/messages`` over an ``OpenAIEndpoint`` (its ``chat_answer``)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def add_routes(self, router, prefix: str) -> None:
        router.add_post(prefix + "/v1/messages", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            chat = chat_body(body)
            if body.get("stream"):
                model = self.endpoint.model_name
                return await self.endpoint.chat_stream(request, chat, lambda n_prompt: MessageEvents(
                    request, model, n_prompt, parse_tools(chat)[1]))
            return json_response(message_object(body, await self.endpoint.chat_answer(request, chat)))
        except (OpenAIError, BodyError) as e:
            return _error(str(e), e.status)
        except ValueError as e:             # the engine refused the input
            return _error(f"{type(e).__name__}: {e}")

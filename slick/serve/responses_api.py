"""OpenAI's Responses API, ``POST /v1/responses``, translated to and from the chat path of ``openai_api``.

What the openai-agents SDK's default model (``OpenAIResponsesModel``) sends works: ``input`` (a string, or items:
messages with ``input_text``/``output_text`` parts, ``function_call`` and ``function_call_output`` items;
``reasoning`` items are dropped), ``instructions`` (a system message), function ``tools``
(``{"type": "function", "name", "parameters"}``), ``tool_choice`` (``auto``/``none``/``required``/a named
function, forced by grammar), ``text.format`` (``json_schema`` / ``json_object``, by grammar),
``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``stream``. Answers carry ``output``
items (a ``message`` with one ``output_text``, then one ``function_call`` per call) and ``usage``. Nothing is
stored: ``previous_response_id``, ``conversation`` and built-in tools (web search, file search, ...) are refused
by name. Accepted and ignored: ``store``, ``include``, ``metadata``, ``user``, ``truncation``, ``reasoning``,
``prompt_cache_key``, ``safety_identifier``, ``service_tier``, ``top_logprobs`` 0.

With ``"stream": true`` the answer streams token by token through the chat endpoint's streamer
(``openai_stream``; :class:`ResponseEvents` turns its chunks into events): ``response.created``,
``response.in_progress``, then for the text ``response.output_item.added``, ``response.content_part.added``, one
``response.output_text.delta`` per piece of text as the engine samples it, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each tool call (once it parsed: text from a
possible ``<tool_call>`` on is held back) ``response.output_item.added``, ``response.function_call_arguments.delta``
(the whole arguments), ``response.function_call_arguments.done``, ``response.output_item.done``; last
``response.completed``, also for a response cut by ``max_output_tokens`` (its ``status`` is then "incomplete").
A failure after the stream began is an ``error`` event and ``response.failed``. A client that disconnects aborts
its generation.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional

from aiohttp import web

from slick.serve.http_body import BodyError, json_response, read_json
from slick.serve.openai_protocol import OpenAIError, parse_tools
from slick.serve.sse import ChunkEvents, LeadingSpace

IGNORED = {"model", "store", "include", "metadata", "user", "truncation", "reasoning", "prompt_cache_key",
           "safety_identifier", "service_tier", "background"}
REFUSED = {"previous_response_id": "slick stores no responses; send the whole conversation in 'input'",
           "conversation": "slick stores no conversations; send the whole conversation in 'input'",
           "prompt": "stored prompts are not supported"}


def _error(e: Exception, status: int = 400, param=None, type="invalid_request_error") -> web.Response:
    return json_response({"error": {"message": str(e), "type": type, "param": param, "code": None}}, status=status)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, p in enumerate(content):
            if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text") \
                    and isinstance(p.get("text"), str):
                out.append(p["text"])
            else:
                raise OpenAIError(f"{where}.content[{i}]: only text parts are supported", param=f"{where}.content")
        return "".join(out)
    raise OpenAIError(f"{where}.content must be a string or a list of text parts", param=f"{where}.content")


def chat_messages(body: dict) -> list[dict]:
    """The chat messages of a Responses request's ``instructions`` and ``input``."""
    msgs = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": str(body["instructions"])})
    inp = body.get("input")
    if isinstance(inp, str):
        return msgs + [{"role": "user", "content": inp}]
    if not isinstance(inp, list) or not inp:
        raise OpenAIError("'input' must be a string or a non-empty list of items", param="input")
    for i, it in enumerate(inp):
        where = f"input[{i}]"
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if kind == "message" and isinstance(it.get("role"), str):
            msgs.append({"role": it["role"], "content": _text(it.get("content"), where)})
        elif kind == "function_call":
            call = {"id": str(it.get("call_id") or ""), "type": "function",
                    "function": {"name": it.get("name"), "arguments": it.get("arguments") or "{}"}}
            if msgs and msgs[-1]["role"] == "assistant":        # the calls of the turn that wrote that text
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out = it.get("output")
            msgs.append({"role": "tool", "tool_call_id": str(it.get("call_id") or ""),
                         "content": out if isinstance(out, str) else _text(out, where)})
        elif kind == "reasoning":
            continue
        else:
            raise OpenAIError(f"{where}: item type {kind!r} is not supported (message, function_call, "
                              "function_call_output)", param=where)
    for m in msgs:      # an assistant message of text parts that was followed by calls stays one message
        if m["role"] == "assistant" and m.get("tool_calls") and m["content"] == "":
            m["content"] = None
    return msgs


def chat_body(body: dict) -> dict:
    """The ``/v1/chat/completions`` body equivalent to a Responses request (refusals name the field)."""
    if not isinstance(body, dict):
        raise OpenAIError("request body must be a JSON object")
    known = {"input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "temperature", "top_p",
             "parallel_tool_calls", "stream", "top_logprobs"}
    for k, v in body.items():
        if k in REFUSED and v is not None:
            raise OpenAIError(f"'{k}': {REFUSED[k]}", param=k)
        if k not in known and k not in IGNORED and k not in REFUSED:
            raise OpenAIError(f"unrecognized request argument supplied: '{k}'", param=k)
    if body.get("top_logprobs"):
        raise OpenAIError("'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions)",
                          param="top_logprobs")
    out = {"messages": chat_messages(body)}
    tools = []
    for i, t in enumerate(body.get("tools") or []):
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("name"), str):
            raise OpenAIError(f"tools[{i}]: only function tools {{'type': 'function', 'name', 'parameters'}} are "
                              f"supported, got {json.dumps(t)[:80]}", param=f"tools[{i}]")
        tools.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                       if t.get(k) is not None}})
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        out["tool_choice"] = choice
    fmt = _text_format(body.get("text"))
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema", {}), "strict": fmt.get("strict")}}
    elif fmt is not None:
        out["response_format"] = fmt
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                     ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(src) is not None:
            out[dst] = body[src]
    return out


JSON_SCHEMA_KEYS = {"type", "name", "schema", "strict", "description"}


def _text_format(text: Any) -> Optional[dict]:
    """``text.format`` of a Responses request, its keys checked: an unknown one is refused by name, never dropped
    (the chat path checks the keys of the other format types)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise OpenAIError("'text' must be an object {\"format\": {...}}", param="text")
    extra = sorted(set(text) - {"format"})
    if extra:
        raise OpenAIError(f"text.{extra[0]} is not supported by slick (only text.format)", param=f"text.{extra[0]}")
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        unknown = sorted(set(fmt) - JSON_SCHEMA_KEYS)
        if unknown:
            raise OpenAIError(f"text.format of type 'json_schema' has no field {unknown[0]!r} (it takes "
                              f"{', '.join(sorted(JSON_SCHEMA_KEYS))})", param="text.format")
    return fmt


def response_object(body: dict, chat: dict) -> dict:
    """A Responses ``response`` from a chat answer."""
    ch = chat["choices"][0]
    msg = ch["message"]
    output = [message_item(f"msg_{uuid.uuid4().hex}", msg["content"])] if msg.get("content") else []
    output += [call_item(f"fc_{uuid.uuid4().hex}", c) for c in msg.get("tool_calls") or []]
    return response_shell(body, chat["model"], f"resp_{uuid.uuid4().hex}", output, ch["finish_reason"],
                          chat["usage"])


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def call_item(item_id: str, call: dict, status: str = "completed") -> dict:
    """A ``function_call`` output item from a chat tool call."""
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def response_shell(body: dict, model: str, resp_id: str, output: list, finish: Optional[str],
                   u: Optional[dict]) -> dict:
    """A ``response`` object: ``finish`` None is one in progress, "length" an incomplete one; ``u`` the chat
    usage (None while in progress)."""
    length = finish == "length"
    status = "in_progress" if finish is None else "incomplete" if length else "completed"
    usage = None if u is None else {
        "input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
        "total_tokens": u["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0}}
    return {"id": resp_id, "object": "response", "created_at": int(time.time()),
            "status": status, "model": model, "output": output,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "max_output_tokens": body.get("max_output_tokens"),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "text": body.get("text") or {"format": {"type": "text"}}, "store": False, "usage": usage}


class ResponseEvents(ChunkEvents):
    """The Responses API's streaming events from chat chunks (module doc), numbered by ``sequence_number``."""

    def __init__(self, request: web.Request, body: dict, model: str, calls: bool):
        super().__init__(request)
        self.body, self.model = body, model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.output: list[dict] = []          # finished items
        self.msg: Optional[dict] = None       # the message item while its text streams
        self.lead = LeadingSpace(calls)       # ``calls``: the answer is parsed for tool calls
        self.calls = False
        self.seq = 0

    def _ev(self, event: str, /, **payload) -> tuple[str, dict]:
        self.seq += 1
        return event, {"type": event, "sequence_number": self.seq - 1, **payload}

    def _resp(self, finish: Optional[str], usage: Optional[dict]) -> dict:
        return response_shell(self.body, self.model, self.id, list(self.output), finish, usage)

    def on_open(self) -> list:
        start = self._resp(None, None)
        return [self._ev("response.created", response=start), self._ev("response.in_progress", response=start)]

    def _text(self, text: str) -> list:
        ev = []
        if self.msg is None:
            self.msg = message_item(f"msg_{uuid.uuid4().hex}", "", "in_progress")
            part = self.msg["content"][0]
            ev += [self._ev("response.output_item.added", output_index=len(self.output),
                            item={**self.msg, "content": []}),
                   self._ev("response.content_part.added", output_index=len(self.output), item_id=self.msg["id"],
                            content_index=0, part=dict(part))]
        self.msg["content"][0]["text"] += text
        return ev + [self._ev("response.output_text.delta", output_index=len(self.output), item_id=self.msg["id"],
                              content_index=0, delta=text, logprobs=[])]

    def on_text(self, text: str) -> list:
        text = self.lead.feed(text)
        return self._text(text) if text else []

    def _end_message(self) -> list:
        if self.msg is None:
            return []
        item, i = {**self.msg, "status": "completed"}, len(self.output)
        part = item["content"][0]
        self.output.append(item)
        self.msg = None
        return [self._ev("response.output_text.done", output_index=i, item_id=item["id"], content_index=0,
                         text=part["text"], logprobs=[]),
                self._ev("response.content_part.done", output_index=i, item_id=item["id"], content_index=0,
                         part=part),
                self._ev("response.output_item.done", output_index=i, item=item)]

    def on_calls(self, calls: list[dict]) -> list:
        self.calls = True
        self.lead.rest(calls=True)
        ev = self._end_message()
        for c in calls:
            item, i = call_item(f"fc_{uuid.uuid4().hex}", c), len(self.output)
            ev += [self._ev("response.output_item.added", output_index=i,
                            item={**item, "arguments": "", "status": "in_progress"}),
                   self._ev("response.function_call_arguments.delta", output_index=i, item_id=item["id"],
                            delta=item["arguments"]),
                   self._ev("response.function_call_arguments.done", output_index=i, item_id=item["id"],
                            name=item["name"], arguments=item["arguments"]),
                   self._ev("response.output_item.done", output_index=i, item=item)]
            self.output.append(item)
        return ev

    def on_close(self) -> list:
        rest = self.lead.rest(calls=self.calls)
        ev = (self._text(rest) if rest else []) + self._end_message()
        # always "response.completed" (its response's status says "incomplete" after a length limit): the openai
        # client's stream helper and the Agents SDK take the final response from that event only
        return ev + [self._ev("response.completed", response=self._resp(self.finish_reason or "stop", self.usage))]

    def on_error(self, error: dict) -> list:
        failed = {**self._resp("stop", self.usage), "status": "failed",
                  "error": {"code": "server_error", "message": str(error.get("message"))}}
        return [self._ev("error", code=error.get("type"), message=error.get("message"), param=error.get("param")),
                self._ev("response.failed", response=failed)]


class ResponsesAPI:
    """``POST /v1/responses`` over an ``OpenAIEndpoint`` (its ``chat_answer``)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def add_routes(self, router, prefix: str) -> None:
        router.add_post(prefix + "/v1/responses", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            chat = chat_body(body)
            if body.get("stream"):
                model = self.endpoint.model_name
                return await self.endpoint.chat_stream(request, chat, lambda n_prompt: ResponseEvents(
                    request, body, model, parse_tools(chat)[1]))
            return json_response(response_object(body, await self.endpoint.chat_answer(request, chat)))
        except OpenAIError as e:
            return _error(e, e.status, e.param, e.type)
        except BodyError as e:
            return _error(e, e.status, e.param)
        except ValueError as e:             # the engine refused the input
            return _error(f"{type(e).__name__}: {e}")

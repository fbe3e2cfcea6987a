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

With ``"stream": true`` the events (``response.created`` ... ``response.output_text.delta`` ...
``response.completed``, also for a response cut by ``max_output_tokens``, whose ``status`` is then
"incomplete") are sent once the answer is complete: the whole text is one delta (the chat endpoint streams token
by token; this one does not yet).
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from slick.serve.http_body import BodyError, json_response, read_json
from slick.serve.openai_protocol import OpenAIError
from slick.serve.sse import send_events

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
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
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


def response_object(body: dict, chat: dict) -> dict:
    """A Responses ``response`` from a chat answer."""
    ch = chat["choices"][0]
    msg = ch["message"]
    output = []
    if msg.get("content"):
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed",
                       "role": "assistant", "content": [{"type": "output_text", "text": msg["content"],
                                                         "annotations": [], "logprobs": []}]})
    for c in msg.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": c["id"],
                       "name": c["function"]["name"], "arguments": c["function"]["arguments"],
                       "status": "completed"})
    u = chat["usage"]
    length = ch["finish_reason"] == "length"
    return {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
            "status": "incomplete" if length else "completed", "model": chat["model"], "output": output,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "max_output_tokens": body.get("max_output_tokens"),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "text": body.get("text") or {"format": {"type": "text"}}, "store": False,
            "usage": {"input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                      "total_tokens": u["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}}


def stream_events(resp: dict) -> list[tuple[str, dict]]:
    """The Responses streaming events of a finished ``resp`` (created ... completed), numbered."""
    start = {**resp, "status": "in_progress", "output": [], "usage": None}
    ev = [("response.created", {"response": start}), ("response.in_progress", {"response": start})]
    for i, item in enumerate(resp["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            part0 = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ev.append(("response.output_item.added", {"output_index": i, "item": {**item, "status": "in_progress",
                                                                                   "content": []}}))
            ev.append(("response.content_part.added", {"output_index": i, "item_id": item["id"], "content_index": 0,
                                                        "part": part0}))
            ev.append(("response.output_text.delta", {"output_index": i, "item_id": item["id"], "content_index": 0,
                                                       "delta": text, "logprobs": []}))
            ev.append(("response.output_text.done", {"output_index": i, "item_id": item["id"], "content_index": 0,
                                                      "text": text, "logprobs": []}))
            ev.append(("response.content_part.done", {"output_index": i, "item_id": item["id"], "content_index": 0,
                                                       "part": item["content"][0]}))
        else:
            ev.append(("response.output_item.added", {"output_index": i, "item": {**item, "arguments": "",
                                                                                   "status": "in_progress"}}))
            ev.append(("response.function_call_arguments.delta", {"output_index": i, "item_id": item["id"],
                                                                   "delta": item["arguments"]}))
            ev.append(("response.function_call_arguments.done", {"output_index": i, "item_id": item["id"],
                                                                  "name": item["name"],
                                                                  "arguments": item["arguments"]}))
        ev.append(("response.output_item.done", {"output_index": i, "item": item}))
    # always "response.completed" (its response's status says "incomplete" after a length limit): the openai
    # client's stream helper and the Agents SDK take the final response from that event only
    ev.append(("response.completed", {"response": resp}))
    return [(name, {"type": name, "sequence_number": n, **payload}) for n, (name, payload) in enumerate(ev)]


class ResponsesAPI:
    """``POST /v1/responses`` over an ``OpenAIEndpoint`` (its ``chat_answer``)."""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def add_routes(self, router, prefix: str) -> None:
        router.add_post(prefix + "/v1/responses", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            chat = await self.endpoint.chat_answer(request, chat_body(body))
            resp = response_object(body, chat)
        except OpenAIError as e:
            return _error(e, e.status, e.param, e.type)
        except BodyError as e:
            return _error(e, e.status, e.param)
        except ValueError as e:             # the engine refused the input
            return _error(f"{type(e).__name__}: {e}")
        if body.get("stream"):
            return await send_events(request, stream_events(resp))
        return json_response(resp)

"""Forced tool calls and structured output as grammars for the engine (``slick/engine/grammar.py``).

- ``tool_choice: "required"`` -> the answer is Hermes calls ``<tool_call>\\n{"name": N, "arguments":
  {...}}\\n</tool_call>``, each ``name`` one of ``tools`` and its ``arguments`` valid against that tool's
  ``parameters`` schema: exactly one unless the request sets ``parallel_tool_calls: true``, then one to
  :data:`MAX_PARALLEL_CALLS` (a forced answer stops after its calls instead of repeating them up to
  ``max_tokens``);
- ``tool_choice: {"type": "function", "function": {"name": N}}`` -> exactly one call of ``N``;
- ``response_format: {"type": "json_object"}`` -> a JSON object (with instructor's ``"schema"`` beside the type:
  JSON valid against it); ``{"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}}`` -> JSON valid against ``schema`` (``strict`` or not: the grammar always holds);
- ``response_format`` with ``tools`` and ``tool_choice`` "auto": either calls (one to :data:`MAX_PARALLEL_CALLS`,
  one when ``parallel_tool_calls`` is false) or the structured answer.

The grammars are llguidance's Lark syntax (sent as the engine's ``ebnf`` field) or a JSON schema (``json_schema``),
SGLang's names, so the same request fields reach an SGLang server behind ``--rollout-urls`` unchanged. JSON is
compact (``{"a": 1, "b": [1, 2]}``, no free whitespace): the schema carries llguidance's options (``x-guidance``),
so SGLang's llguidance backend holds the same JSON as slick's engine. The Hermes format is the one ``slick.chat.toolcall``
renders into prompts and parses; another ``--tool-parser`` cannot be forced (refused by name).
"""
from __future__ import annotations

import json
from typing import Any, Optional

from slick.engine.grammar import compact_schema, json_lark
from slick.serve.openai_protocol import OpenAIError, forced_tool

OPEN, CLOSE = "<tool_call>\n", "\n</tool_call>"
MAX_PARALLEL_CALLS = 8      # calls one constrained answer may hold when parallel calls are allowed


FORMAT_KEYS = {"text": {"type"}, "json_object": {"type", "schema"}, "json_schema": {"type", "json_schema"}}


def response_schema(fmt: Any) -> Optional[dict]:
    """The JSON schema ``response_format`` asks for, or None for text / absent. ``json_object`` may carry a
    ``schema`` (instructor's JSON_SCHEMA mode sends it there), which then holds; any other key is refused."""
    if fmt is None or fmt == {"type": "text"}:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    unknown = sorted(set(fmt) - FORMAT_KEYS[kind]) if kind in FORMAT_KEYS else []
    if unknown:
        raise OpenAIError(f"response_format of type {kind!r} has no field {unknown[0]!r} (it takes "
                          f"{', '.join(sorted(FORMAT_KEYS[kind]))})", param="response_format")
    if kind == "json_object":
        schema = fmt.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise OpenAIError("response_format.schema must be a JSON schema object", param="response_format")
        return schema
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise OpenAIError("response_format.json_schema must be an object {\"name\", \"schema\", \"strict\"}",
                              param="response_format")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise OpenAIError("response_format.json_schema.schema must be a JSON schema object",
                              param="response_format")
        return schema
    raise OpenAIError(f"response_format {json.dumps(fmt)[:80]} must have type \"text\", \"json_object\" or "
                      "\"json_schema\"", param="response_format")


def _lit(s: str) -> str:
    return json.dumps(s)         # a Lark string literal (JSON escapes)


SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")   # name -> schema
SCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def closed_objects(schema: Any, depth: int = 0) -> Any:
    """A copy of ``schema`` where every object schema that lists ``properties`` and none of :data:`OPEN_KEYS`
    takes no other key (``additionalProperties: false``, what OpenAI's strict mode requires of a tool). Walks
    subschemas only (never ``enum``/``const``/``default`` values); below 64 levels it leaves the rest as it is
    (the engine's depth limit refuses such a grammar anyway). A schema that intersects several subschemas
    (``allOf`` of two or more) is left open: closing each part would refuse the other parts' keys."""
    if not isinstance(schema, dict) or depth > 64:
        return schema
    if depth == 0 and _intersects(schema):
        return schema
    out = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v, depth + 1) for k, v in out[key].items()}
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v, depth + 1) for v in out[key]]
    for key in SCHEMA_ONE:
        if isinstance(out.get(key), dict):
            out[key] = closed_objects(out[key], depth + 1)
    if isinstance(out.get("items"), list):      # draft 4's tuple form
        out["items"] = [closed_objects(v, depth + 1) for v in out["items"]]
    if isinstance(out.get("properties"), dict) and out["properties"] and not any(k in out for k in OPEN_KEYS):
        out["additionalProperties"] = False
    return out


def _intersects(schema: Any) -> bool:
    """Whether ``schema`` holds an ``allOf`` of two or more subschemas anywhere (no recursion: a work list)."""
    todo, seen = [schema], 0
    while todo and seen < 100_000:
        x = todo.pop()
        seen += 1
        if isinstance(x, dict):
            if isinstance(x.get("allOf"), list) and len(x["allOf"]) > 1:
                return True
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
    return False


def _call_schema(tools: list, name: Optional[str]) -> dict:
    alts = []
    for t in tools:
        fn = t["function"]
        if name is not None and fn["name"] != name:
            continue
        params = closed_objects(fn.get("parameters") or {"type": "object", "properties": {}})
        alts.append({"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": params},
                     "required": ["name", "arguments"], "additionalProperties": False})
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def tool_calls_lark(tools: list, name: Optional[str] = None, parallel: bool = True) -> list[str]:
    """Lark rules (without ``start``) for rule ``calls``: Hermes calls of ``tools`` (only ``name`` if given), one,
    or with ``parallel`` one to :data:`MAX_PARALLEL_CALLS`."""
    many = f" ({_lit(chr(10))} call){{0,{MAX_PARALLEL_CALLS - 1}}}" if parallel and name is None else ""
    return [f"calls: call{many}",
            f"call: {_lit(OPEN)} call_body {_lit(CLOSE)}",
            f"call_body: {json_lark(_call_schema(tools, name))}"]


def constraint(body: dict, tools: Optional[list], tool_parser: str = "hermes") -> Optional[dict]:
    """The engine grammar (``{"ebnf": lark}`` or ``{"json_schema": text}``) a chat request asks for, or None."""
    choice = body.get("tool_choice")
    forced = forced_tool(choice, tools or [])
    schema = response_schema(body.get("response_format"))
    if forced is None and schema is None:
        return None
    if forced is not None and schema is not None:
        raise OpenAIError("a forced tool_choice and a JSON response_format cannot both hold for one answer; "
                          "send one", param="response_format")
    calls_possible = forced is not None or (tools and choice != "none")
    if calls_possible and tool_parser != "hermes":
        raise OpenAIError(f"tool_choice / response_format with tools need the hermes tool format; this endpoint "
                          f"parses calls with {tool_parser!r}", param="tool_choice")
    if forced is not None:   # one call unless parallel calls are asked for
        rules = tool_calls_lark(tools, None if forced == "required" else forced,
                                body.get("parallel_tool_calls") is True)
        return {"ebnf": "\n".join(["start: calls"] + rules)}
    if calls_possible:          # auto: calls, or the structured answer
        rules = tool_calls_lark(tools, None, body.get("parallel_tool_calls") is not False)
        return {"ebnf": "\n".join(["start: calls | answer", f"answer: {json_lark(schema)}"] + rules)}
    return {"json_schema": json.dumps(compact_schema(schema), ensure_ascii=False)}

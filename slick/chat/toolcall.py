"""Tool-call parsing and tool schemas in the system prompt.

**Tool-call format** (parser ``hermes``, the default; Hermes/Qwen style): the policy writes each call as a JSON
object inside tags, anywhere in its turn, several calls allowed::

    <tool_call>
    {"name": "add", "arguments": {"a": 2, "b": 3}}
    </tool_call>

``arguments`` is an object (a JSON string holding an object is accepted too, as OpenAI sends it). A call whose
body is not such JSON is still returned, with ``error`` set: the rollout answers it with an error tool message
(counted in ``rollout/tool_errors``) so the policy learns from it instead of the rollout failing. An unclosed
``<tool_call>`` at the end of a turn counts as a malformed call.

**Hostile text.** The policy's turn is untrusted input, so parsing it is linear in its length and cannot raise:
the tags are found with ``str.find`` (no regex that rescans an unclosed tag), and a body (or an ``arguments``
string) nested deeper than :data:`slick.chat.safejson.MAX_DEPTH` (64) levels, or holding an integer of more
than 4300 digits, is refused before ``json`` parses it (:mod:`slick.chat.safejson`), as a call with
``error`` set. A ``--tool-parser`` plug-in that raises gets the same treatment: its exception becomes one
malformed call (an ``Error:`` tool message), not a failed rollout.

**Other parsers**: ``--tool-parser pkg.mod:fn`` (any spelling :func:`slick.plugins.load_function` takes) where
``fn(text: str) -> list[ToolCall | dict]`` and a dict has ``name`` and ``arguments`` (and optionally ``id``,
``error``). :data:`PARSERS` holds the built-in names.

**Templates without tool support** (SmolLM2's ignores ``tools=``): :func:`tools_system_prompt` renders the
schemas into the system message, in this documented format (one OpenAI function schema per line)::

    # Tools
    You can call these functions. Their JSON schemas, one per line:
    <tools>
    {"type": "function", "function": {"name": "add", ...}}
    </tools>
    To call a function, write a JSON object with its name and arguments between <tool_call> and </tool_call>:
    <tool_call>
    {"name": "function_name", "arguments": {"argument": "value"}}
    </tool_call>
    The results come back in messages with the role "tool".

:func:`with_tools_in_system` puts that text after an existing system message's content, or adds a system
message holding it first.
"""
from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from slick.plugins import load_function
from slick.chat.safejson import JSONLimitError, loads, object_end

OPEN, CLOSE = "<tool_call>", "</tool_call>"
log = logging.getLogger("slick.toolcall")
_ids = itertools.count()


@dataclass
class ToolCall:
    """One parsed call. ``error`` is set when the call could not be parsed (the tool is then not run)."""

    name: str
    arguments: dict = field(default_factory=dict)
    id: str = ""
    error: Optional[str] = None

    def __post_init__(self):
        if not self.id:
            self.id = f"call_{next(_ids)}"

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "error": self.error}


def _json_error(what: str, e: JSONLimitError, text: str) -> str:
    if e.limit:
        return f"{what} refused: {e}: {text[:200]!r}"
    return f"{what} is not valid JSON ({e}): {text[:200]!r}"


def _call_from_json(body: str) -> ToolCall:
    body = body.strip()
    try:
        obj = loads(body)
    except JSONLimitError as e:
        return ToolCall(name="", error=_json_error("tool call", e, body))
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(name="", error=f"tool call must be an object with a string 'name': {body[:200]!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads(args) if args.strip() else {}
        except JSONLimitError as e:
            why = _json_error(f"arguments of {obj['name']!r}", e, args) if e.limit else \
                f"arguments of {obj['name']!r} are not a JSON object: {args[:200]!r}"
            return ToolCall(name=obj["name"], error=why)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name=obj["name"], error=f"arguments of {obj['name']!r} must be a JSON object, "
                                                f"got {type(args).__name__}")
    return ToolCall(name=obj["name"], arguments=args, id=str(obj.get("id") or ""))


def tool_call_spans(text: str) -> tuple[list[tuple[int, int]], int]:
    """``([(start, end), ...], unclosed)``: the ``<tool_call>...</tool_call>`` spans of ``text`` in order (each
    from its opening tag to the end of its closing tag) and the position of an opening tag no closing tag follows
    (-1 when none). A body that opens a JSON object runs to the first closing tag after that object's end (a
    ``</tool_call>`` inside a JSON string does not end the call); any other body to the first closing tag.
    Linear time: the scans of closed objects do not overlap, and after one object that never closes, bodies
    end at the first closing tag."""
    spans, pos, scan = [], 0, True
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            return spans, -1
        body = start + len(OPEN)
        obj_end = object_end(text, body) if scan else -1
        if obj_end < 0 and scan and text[body:body + 64].lstrip().startswith("{"):
            scan = False    # an object that runs to the end of the text: no later scan can close either
        end = text.find(CLOSE, obj_end if obj_end >= 0 else body)
        if end < 0:
            return spans, start
        pos = end + len(CLOSE)
        spans.append((start, pos))


def parse_hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``, in order (module doc)."""
    spans, unclosed = tool_call_spans(text)
    calls = [_call_from_json(text[a + len(OPEN):b - len(CLOSE)]) for a, b in spans]
    if unclosed >= 0:
        calls.append(ToolCall(name="", error="unclosed <tool_call> (no </tool_call> before the turn ended)"))
    return calls


def strip_tool_calls(text: str) -> str:
    """``text`` without its closed ``<tool_call>...</tool_call>`` spans (linear time)."""
    spans, _ = tool_call_spans(text)
    parts, pos = [], 0
    for a, b in spans:
        parts.append(text[pos:a])
        pos = b
    parts.append(text[pos:])
    return "".join(parts)


def before_unclosed_call(text: str) -> str:
    """``text`` up to a ``<tool_call>`` that no closing tag follows (all of it when there is none): what stays of
    an answer that a length limit cut inside a call (linear time)."""
    _, unclosed = tool_call_spans(text)
    return text if unclosed < 0 else text[:unclosed]


PARSERS: dict[str, Callable[[str], list]] = {"hermes": parse_hermes}


def get_parser(name: Optional[str] = None, flag: str = "--tool-parser") -> Callable[[str], list[ToolCall]]:
    """A parser by built-in name (default ``hermes``) or dotted path; results normalised to ToolCall."""
    name = name or "hermes"
    fn = PARSERS.get(name) or load_function(name, flag)

    def parse(text: str) -> list[ToolCall]:
        try:
            found = list(fn(text) or [])
        except Exception as e:  # noqa: BLE001 - policy text that breaks a parser is the policy's mistake
            log.warning("%s %r raised %s on a turn of %d characters; answering with an error tool message",
                        flag, name, type(e).__name__, len(text))
            return [ToolCall(name="", error=f"the tool call could not be parsed ({flag} {name!r} raised "
                                            f"{type(e).__name__}: {str(e)[:200]})")]
        out = []
        for c in found:
            if isinstance(c, ToolCall):
                out.append(c)
            elif isinstance(c, dict) and "name" in c:
                args, error = c.get("arguments") or {}, c.get("error")
                if not isinstance(args, dict):
                    args, error = {}, error or f"arguments of {c['name']!r} must be a JSON object, " \
                                               f"got {type(args).__name__}"
                out.append(ToolCall(name=str(c["name"]), arguments=args, id=str(c.get("id") or ""), error=error))
            else:
                raise ValueError(f"{flag} {name!r}: a parser must return ToolCall objects or dicts with 'name' and "
                                 f"'arguments', got {type(c).__name__}")
        return out

    return parse


def tools_system_prompt(tools: Sequence[dict]) -> str:
    """The documented tools section for templates that ignore ``tools=`` (module doc)."""
    lines = ["# Tools", "You can call these functions. Their JSON schemas, one per line:", "<tools>"]
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    lines += ["</tools>",
              "To call a function, write a JSON object with its name and arguments between <tool_call> and "
              "</tool_call>:",
              "<tool_call>", '{"name": "function_name", "arguments": {"argument": "value"}}', "</tool_call>",
              'The results come back in messages with the role "tool".']
    return "\n".join(lines)


def with_tools_in_system(messages: Sequence[dict], tools: Sequence[dict]) -> list[dict]:
    """``messages`` with :func:`tools_system_prompt` appended to the system message (added first if none)."""
    msgs = [dict(m) for m in messages]
    section = tools_system_prompt(tools)
    if msgs and msgs[0].get("role") == "system":
        msgs[0]["content"] = f"{msgs[0].get('content') or ''}\n\n{section}".lstrip("\n")
    else:
        msgs.insert(0, {"role": "system", "content": section})
    return msgs

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
import re
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from slick.plugins import load_function

_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
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


def _call_from_json(body: str) -> ToolCall:
    body = body.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(name="", error=f"tool call is not valid JSON ({e.msg} at column {e.colno}): {body[:200]!r}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(name="", error=f"tool call must be an object with a string 'name': {body[:200]!r}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(name=obj["name"], error=f"arguments of {obj['name']!r} are not a JSON object: {args[:200]!r}")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name=obj["name"], error=f"arguments of {obj['name']!r} must be a JSON object, "
                                                f"got {type(args).__name__}")
    return ToolCall(name=obj["name"], arguments=args, id=str(obj.get("id") or ""))


def parse_hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` in ``text``, in order (module doc)."""
    calls = [_call_from_json(m.group(1)) for m in _CALL_RE.finditer(text)]
    tail = text[text.rfind("</tool_call>") + len("</tool_call>"):] if "</tool_call>" in text else text
    if "<tool_call>" in tail:
        calls.append(ToolCall(name="", error="unclosed <tool_call> (no </tool_call> before the turn ended)"))
    return calls


PARSERS: dict[str, Callable[[str], list]] = {"hermes": parse_hermes}


def get_parser(name: Optional[str] = None, flag: str = "--tool-parser") -> Callable[[str], list[ToolCall]]:
    """A parser by built-in name (default ``hermes``) or dotted path; results normalised to ToolCall."""
    name = name or "hermes"
    fn = PARSERS.get(name) or load_function(name, flag)

    def parse(text: str) -> list[ToolCall]:
        out = []
        for c in fn(text) or []:
            if isinstance(c, ToolCall):
                out.append(c)
            elif isinstance(c, dict) and "name" in c:
                out.append(ToolCall(name=str(c["name"]), arguments=dict(c.get("arguments") or {}),
                                    id=str(c.get("id") or ""), error=c.get("error")))
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

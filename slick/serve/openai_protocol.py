"""OpenAI request checking and answer building for ``slick/serve/openai_api.py`` (pure functions, no I/O).

See ``openai_api``'s docstring for what is honoured, refused and added; ``Call`` / ``Choice`` are what an agent
session records (``slick/rollout/agent.py``).
"""
from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from slick.chat.delta import encode, render, template_supports_tools
from slick.chat.toolcall import before_unclosed_call, strip_tool_calls, with_tools_in_system   # linear scans
from slick.types import Generation, SamplingParams

MAX_N = 128
# accepted and ignored: they do not change what is sampled
IGNORED = {"model", "user", "metadata", "store", "service_tier", "parallel_tool_calls",
           "prediction", "modalities", "audio", "web_search_options", "safety_identifier", "prompt_cache_key"}
DEFAULT_ONLY = {"presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None, "response_format": None,
                "reasoning_effort": None, "functions": None, "function_call": None, "suffix": None,
                "echo": False, "best_of": None, "verbosity": None}
HONOURED_COMMON = {"n", "stop", "max_tokens", "temperature", "top_p", "seed", "logprobs", "stream",
                   "stream_options", "top_k", "ignore_eos", "return_token_ids"}
HONOURED_CHAT = HONOURED_COMMON | {"messages", "tools", "tool_choice", "top_logprobs", "max_completion_tokens",
                                   "response_format"}
HONOURED_COMPLETION = HONOURED_COMMON | {"prompt"}


class OpenAIError(Exception):
    """A request slick refuses; answered with ``status`` and OpenAI's error object."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.type = status, param, type


# ----------------------------------------------------------------------------- request parsing (pure)
@dataclass
class Params:
    """The sampling-related fields of a request, checked."""

    n: int = 1
    max_tokens: Optional[int] = None        # None: fill the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: Optional[int] = None
    stop: list = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0                   # alternatives per token (chat top_logprobs, completions logprobs)
    return_token_ids: bool = False
    model: Optional[str] = None
    stream: bool = False
    include_usage: bool = False             # stream_options.include_usage
    grammar: Optional[dict] = None          # {"json_schema"|"ebnf": text}: set by openai_constraints

    def engine_fields(self) -> dict:
        """What the engine must honour beyond plain sampling: the grammar and the top logprobs."""
        return {**(self.grammar or {}), "top_logprobs_num": self.top_logprobs}

    def sampling(self, max_new_tokens: int, index: int = 0) -> SamplingParams:
        """SamplingParams for choice ``index`` (seed + index when a seed is given)."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=max_new_tokens, stop=list(self.stop) or None,
                              seed=None if self.seed is None else self.seed + index, ignore_eos=self.ignore_eos,
                              **self.engine_fields())


def _int(body: dict, key: str, lo: Optional[int] = None, hi: Optional[int] = None) -> Optional[int]:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not float(v).is_integer():
        raise OpenAIError(f"'{key}' must be an integer, got {v!r}", param=key)
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise OpenAIError(f"'{key}' must be {rng}, got {v}", param=key)
    return v


def _float(body: dict, key: str, lo: float, hi: float, lo_open: bool = False) -> Optional[float]:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise OpenAIError(f"'{key}' must be a number, got {v!r}", param=key)
    if v > hi or v < lo or (lo_open and v == lo):
        raise OpenAIError(f"'{key}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {v}", param=key)
    return float(v)


def _bool(body: dict, key: str) -> Optional[bool]:
    v = body.get(key)
    if v is not None and not isinstance(v, bool):
        raise OpenAIError(f"'{key}' must be a boolean, got {v!r}", param=key)
    return v


def _is_default(v: Any, default: Any) -> bool:
    if v is None:
        return True
    if default is None:
        return v in ({}, [], "") or v == {"type": "text"}
    if isinstance(v, bool) or isinstance(default, bool):
        return v is default
    return isinstance(v, (int, float)) and v == default


def _stream(body: dict) -> tuple[bool, bool]:
    """(``stream``, ``stream_options.include_usage``); options other than include_usage are refused."""
    stream = bool(_bool(body, "stream"))
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise OpenAIError(f"'stream_options' must be an object, got {json.dumps(opts)[:80]}", param="stream_options")
    if not stream:
        raise OpenAIError("'stream_options' is only allowed with \"stream\": true", param="stream_options")
    for k in opts:
        if k != "include_usage":
            raise OpenAIError(f"stream_options.{k} is not supported (only include_usage)", param="stream_options")
    return stream, bool(_bool(opts, "include_usage"))


def parse_params(body: Any, chat: bool) -> Params:
    """Check the fields every request shares; raise :class:`OpenAIError` naming a field slick cannot honour."""
    if not isinstance(body, dict):
        raise OpenAIError(f"request body must be a JSON object, got {type(body).__name__}")
    known = HONOURED_CHAT if chat else HONOURED_COMPLETION
    for key, v in body.items():
        if key in known or key in IGNORED:
            continue
        if key in DEFAULT_ONLY:
            if not _is_default(v, DEFAULT_ONLY[key]):
                only = "null" if DEFAULT_ONLY[key] is None else f"{json.dumps(DEFAULT_ONLY[key])} or null"
                raise OpenAIError(f"'{key}' = {json.dumps(v)[:80]} is not supported by slick (only {only})",
                                  param=key)
            continue
        raise OpenAIError(f"unrecognized request argument supplied: '{key}'", param=key)
    p = Params()
    p.stream, p.include_usage = _stream(body)
    p.n = _int(body, "n", 1, MAX_N) or 1
    mt = _int(body, "max_tokens", 1)
    if chat:
        mct = _int(body, "max_completion_tokens", 1)
        if mt is not None and mct is not None and mt != mct:
            raise OpenAIError(f"'max_tokens' ({mt}) and 'max_completion_tokens' ({mct}) disagree; send one",
                              param="max_completion_tokens")
        mt = mct if mct is not None else mt
    p.max_tokens = mt
    t = _float(body, "temperature", 0.0, 2.0)
    p.temperature = 1.0 if t is None else t
    tp = _float(body, "top_p", 0.0, 1.0, lo_open=True)
    p.top_p = 1.0 if tp is None else tp
    tk = _int(body, "top_k")
    p.top_k = -1 if tk is None or tk <= 0 else tk
    p.seed = _int(body, "seed")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise OpenAIError("'stop' must be a string or a list of strings", param="stop")
    p.stop = [s for s in (stop or []) if s]
    p.ignore_eos = bool(_bool(body, "ignore_eos"))
    p.return_token_ids = bool(_bool(body, "return_token_ids"))
    if chat:
        p.logprobs = bool(_bool(body, "logprobs"))
        p.top_logprobs = _int(body, "top_logprobs", 0, 20) or 0
        if p.top_logprobs and not p.logprobs:
            raise OpenAIError("'top_logprobs' needs \"logprobs\": true", param="top_logprobs")
    else:
        lp = _int(body, "logprobs", 0, 5)
        p.logprobs, p.top_logprobs = lp is not None, lp or 0
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise OpenAIError(f"'model' must be a string, got {model!r}", param="model")
    p.model = model
    return p


def check_sizes(body: Any, chat: bool, max_context: Optional[int], max_chars: Optional[int]) -> None:
    """Refuse (413) a request whose prompt cannot fit the context, before any per-message or per-token work:
    chat messages whose text adds up to more than ``max_chars`` characters, a completion prompt string longer
    than that, or a token-id prompt of ``max_context`` tokens or more. Linear in the number of messages/parts."""
    if not isinstance(body, dict):
        return
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or max_chars is None:
            return
        total = 0
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                total += len(c)
            elif isinstance(c, list):
                total += sum(len(p["text"]) for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        if total > max_chars:
            raise OpenAIError(f"'messages' hold {total} characters; more than {max_chars} cannot fit the context "
                              f"(longest token x (context - 1)), refused before rendering", 413, param="messages")
        return
    p = body.get("prompt")
    prompts = p if isinstance(p, list) and p and isinstance(p[0], (str, list)) else [p]
    for i, x in enumerate(prompts):
        if isinstance(x, str) and max_chars is not None and len(x) > max_chars:
            raise OpenAIError(f"prompt[{i}] has {len(x)} characters; more than {max_chars} cannot fit the context, "
                              f"refused before tokenizing", 413, param="prompt")
        if isinstance(x, list) and max_context is not None and len(x) >= max_context:
            raise OpenAIError(f"prompt[{i}] has {len(x)} tokens; the context is {max_context}", 413, param="prompt")


def _content_text(content: Any, where: str) -> Optional[str]:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise OpenAIError(f"{where}.content[{i}]: only text parts are supported, got {kind!r}",
                                  param=f"{where}.content")
        return "".join(parts)
    raise OpenAIError(f"{where}.content must be a string, a list of text parts or null", param=f"{where}.content")


def parse_messages(body: dict) -> list[dict]:
    """Chat messages normalised to ``{"role", "content": str | None, ("tool_calls", "tool_call_id", "name")}``;
    tool-call ``arguments`` become objects."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise OpenAIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise OpenAIError(f"{where} must be an object with a string 'role'", param=where)
        role = "system" if m["role"] == "developer" else m["role"]
        if role not in ("system", "user", "assistant", "tool"):
            raise OpenAIError(f"{where}.role {m['role']!r} is not one of system, developer, user, assistant, tool",
                              param=f"{where}.role")
        msg = {"role": role, "content": _content_text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise OpenAIError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            msg["tool_calls"] = [_parse_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
        elif msg["content"] is None:
            raise OpenAIError(f"{where}.content is missing", param=f"{where}.content")
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = str(m["tool_call_id"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _parse_call(c: Any, where: str) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise OpenAIError(f"{where} must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}", param=where)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise OpenAIError(f"{where}.function.arguments is not JSON: {e}", param=where) from None
    if not isinstance(args, dict):
        raise OpenAIError(f"{where}.function.arguments must be a JSON object", param=where)
    return {"id": str(c.get("id") or ""), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def parse_tools(body: dict) -> tuple[Optional[list], bool]:
    """(``tools`` as OpenAI function tools or None, whether answers are parsed for tool calls). ``tool_choice``
    "required" or a named function is checked here and enforced by grammar (``openai_constraints``)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is not None and tools != [] and not isinstance(tools, list):
        raise OpenAIError("'tools' must be a list", param="tools")
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise OpenAIError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                              "'parameters': {...}}}", param=f"tools[{i}]")
    forced = forced_tool(choice, tools or [])
    if not tools:
        return None, False
    return tools, choice != "none" or forced is not None


def forced_tool(choice: Any, tools: list) -> Optional[str]:
    """None (``auto``/``none``/absent), ``"required"``, or the name of the function ``tool_choice`` names."""
    if choice is None or choice in ("auto", "none"):
        return None
    if choice == "required":
        name = "required"
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(
            (choice.get("function") or {}).get("name", choice.get("name")), str):
        name = (choice.get("function") or {}).get("name", choice.get("name"))
        if name not in [t["function"]["name"] for t in tools]:
            raise OpenAIError(f"tool_choice names function {name!r}, which is not in 'tools'", param="tool_choice")
    else:
        raise OpenAIError(f"tool_choice {json.dumps(choice)[:80]} must be \"auto\", \"none\", \"required\" or "
                          "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
    if not tools:
        raise OpenAIError(f"tool_choice {json.dumps(choice)[:80]} needs 'tools'", param="tool_choice")
    return name


def parse_prompts(body: dict, vocab_size: Optional[int]) -> tuple[list, bool]:
    """The ``/v1/completions`` prompts (strings or token-id lists) and whether the request was a batch."""
    p = body.get("prompt")
    if isinstance(p, str) or (isinstance(p, list) and p and all(_is_tok(t) for t in p)):
        prompts, batched = [p], False
    elif isinstance(p, list) and p and all(isinstance(x, str) or (isinstance(x, list) and x and all(
            _is_tok(t) for t in x)) for x in p):
        prompts, batched = list(p), True
    else:
        raise OpenAIError("'prompt' must be a string, a list of token ids, or a non-empty list of either",
                          param="prompt")
    for i, x in enumerate(prompts):
        if isinstance(x, list) and vocab_size is not None:
            bad = [t for t in x if t < 0 or t >= vocab_size]
            if bad:
                raise OpenAIError(f"prompt[{i}] has token id {bad[0]} outside the vocabulary [0, {vocab_size})",
                                  param="prompt")
        if isinstance(x, str) and not x:
            raise OpenAIError(f"prompt[{i}] is empty", param="prompt")
    return prompts, batched


def _is_tok(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


# ----------------------------------------------------------------------------- prompts
def template_messages(tokenizer, messages: list[dict], tools: Optional[list]) -> tuple[list[dict], Optional[list]]:
    """(messages, tools) as the chat template takes them: with tools rendered into the system message and
    tool calls written as Hermes text when the template ignores ``tools=`` (:mod:`slick.chat.toolcall`)."""
    native = template_supports_tools(tokenizer)
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        if m.get("tool_calls") and not native:
            text = "".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                          "arguments": c["function"]["arguments"]},
                                                         ensure_ascii=False) + "\n</tool_call>"
                           for c in m.pop("tool_calls"))
            m["content"] = (m.get("content") or "") + ("\n" if m.get("content") else "") + text
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    if tools and not native:
        return with_tools_in_system(out, tools), None
    return out, tools


def render_chat(tokenizer, messages: list[dict], tools: Optional[list]) -> tuple[list[int], str]:
    """Token ids and text of a chat prompt (the template's text with the generation prompt)."""
    msgs, tmpl_tools = template_messages(tokenizer, messages, tools)
    try:
        text = render(tokenizer, msgs, tmpl_tools, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - a Jinja template raising on these messages
        raise OpenAIError(f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                          param="messages") from None
    return encode(tokenizer, text), text


# ----------------------------------------------------------------------------- answers (pure)
def response_text(tokenizer, gen: Generation, sp: SamplingParams, eos_ids) -> tuple[str, int]:
    """(text, number of leading tokens the text covers): the matched stop token and stop string are cut off."""
    ids = list(gen.token_ids)
    n = len(ids)
    stop_ids = set() if sp.ignore_eos else set(eos_ids) | set(sp.stop_token_ids or ())
    if gen.finish_reason == "stop" and ids and ids[-1] in stop_ids:
        n -= 1
    text = tokenizer.decode(ids[:n], skip_special_tokens=True)
    if gen.finish_reason == "stop" and sp.stop:
        cut = [i for i in (text.find(s) for s in sp.stop) if i >= 0]
        if cut:
            text = text[:min(cut)]
    return text, n


def split_tool_calls(text: str, parser: Callable[[str], list], cut: bool = False) -> tuple[Optional[str], list[dict]]:
    """(content, OpenAI ``tool_calls``) of an answer; with no readable call the whole text is the content. ``cut``:
    a length limit ended the answer, and the call it cut off (an unclosed ``<tool_call>`` on) is dropped, not
    returned as content."""
    if cut:
        text = before_unclosed_call(text)
    calls = [c for c in parser(text) if not c.error]
    if not calls:
        return (text if text or not cut else None), []

    content = strip_tool_calls(text).strip()
    out = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}} for c in calls]
    return content or None, out


def finish_reason(gen: Generation, tool_calls: bool = False) -> str:
    if gen.finish_reason == "stop":
        return "tool_calls" if tool_calls else "stop"
    return gen.finish_reason          # "length", or "abort" (the rollout was stopped)


def token_logprobs(tokenizer, ids: list[int], logprobs: list[float], tops: Optional[list] = None) -> list[dict]:
    """Chat ``logprobs.content`` entries: the token's text, its logprob and UTF-8 bytes, and ``top_logprobs``
    (the engine's ``(id, logprob)`` alternatives of each step, when asked)."""
    out = []
    for i, (t, lp) in enumerate(zip(ids, logprobs)):
        s = tokenizer.decode([t], skip_special_tokens=False)
        alts = []
        for a, alp in (tops[i] if tops is not None and i < len(tops) else ()):
            at = tokenizer.decode([a], skip_special_tokens=False)
            alts.append({"token": at, "logprob": float(alp), "bytes": list(at.encode("utf-8"))})
        out.append({"token": s, "logprob": float(lp), "bytes": list(s.encode("utf-8")), "top_logprobs": alts})
    return out


def completion_logprobs(tokenizer, ids: list[int], logprobs: list[float], tops: Optional[list],
                        offset: int = 0) -> dict:
    """``/v1/completions`` ``logprobs``: tokens, their logprobs, text offsets from ``offset``, and per token a
    ``{text: logprob}`` of the alternatives (None unless asked)."""
    toks = [tokenizer.decode([t], skip_special_tokens=False) for t in ids]
    offs, pos = [], offset
    for s in toks:
        offs.append(pos)
        pos += len(s)
    top = None
    if tops is not None:
        top = [{tokenizer.decode([a], skip_special_tokens=False): float(lp) for a, lp in alts} for alts in tops]
    return {"tokens": toks, "token_logprobs": [float(x) for x in logprobs], "top_logprobs": top, "text_offset": offs}


def usage(prompt_tokens: int, gens: list[Generation]) -> dict:
    c = sum(len(g.token_ids) for g in gens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": c, "total_tokens": prompt_tokens + c}


# ----------------------------------------------------------------------------- recording hooks
@dataclass
class Choice:
    """What the engine produced for one choice, recorded for training."""

    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finish_reason: str
    message: Optional[dict] = None      # chat: the assistant message returned to the client
    text: str = ""


@dataclass
class Call:
    """One request of a session: the exact prompt tokens the engine saw and every choice it sampled."""

    kind: str                                   # "chat" or "completion"
    prompt_ids: list[int]
    choices: list[Choice]
    messages: Optional[list[dict]] = None       # chat: the request's messages (normalised)
    tools: Optional[list] = None
    prompt_text: Optional[str] = None
    parent: Optional[tuple[int, int]] = None    # (call, choice) whose tokens this prompt extends (set by a session)

"""Does a chat template preserve prefixes? Fuzzed conversations, rendered where a multi-turn rollout renders them.

A multi-turn rollout is token-exact by concatenation (:mod:`slick.chat.delta`) only when the template's text for a
conversation is a prefix of its text for every longer one. Templates that rewrite history break that: Qwen3's
drops the ``<think>`` block of earlier assistant turns, others count messages in a header or show only the last
N messages. :func:`check_template` finds out for one tokenizer: it generates ``cases`` seeded conversations
(a system prompt or not, 1-4 turns, tool calls and tool results, with the tool schemas given to the template
when it renders them, reasoning as ``<think>...</think>`` in the content or as ``reasoning_content``) and
renders each at the points the rollout does:

* before every assistant turn, with the generation prompt (what the policy is prompted with), and
* after it, without (what the next step's delta is cut from); the messages between two assistant turns (a user
  turn, or all the tool results of one step) are appended together, as the rollout appends them.

Each rendering must start with the one before (the check :class:`slick.chat.delta.ChatDelta` makes at every
step). The report names, per conversation, the first step where it does not (the assistant turn, the messages
appended, the character where the texts part, with both texts around it). It also compares the token ids of the
renderings, tokenized whole: where the text is a prefix but the tokens are not (a token merging across the
boundary), concatenation stays exact (the policy's tokens and each delta are kept as tokenized), so that is
reported but does not count as a rewrite.

Pure: no torch, no model; only the tokenizer's ``apply_chat_template`` and its encoder. ``slick check-template
MODEL_DIR`` (:mod:`slick.chat.template_check_cli`) prints the report; the built-in multi-turn rollout runs the
check once per tokenizer (:func:`check_template_cached`) to choose between exact concatenation and one training
sample per assistant turn (docs/agents.md).
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

from slick.chat.delta import encode, render, template_supports_tools

_WORDS = ("the", "answer", "is", "seven", "let", "me", "check", "first", "add", "numbers", "then", "carry", "one",
          "so", "we", "get", "42", "3.5", "ok", "done", "next", "value", "result", "maybe", "higher", "lower",
          "é", "日本", "x = 2", "\"quoted\"", "{braces}", "a-b", "(paren)", "twelve")
_TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the corpus.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}},
]
CONTEXT = 48   # characters of text shown around a divergence


@dataclass(frozen=True)
class Divergence:
    """Where a longer rendering stops extending the shorter one (``kind`` "text" or "tokens").

    ``turn``: the 1-based assistant turn where concatenation breaks: the policy's turn ``turn`` itself (the
    conversation after it does not extend its prompt), or the prompt of turn ``turn`` (the messages appended
    after turn ``turn - 1`` rewrite what came before); ``appended``: the indices of the messages appended in the
    step, ``roles`` theirs;
    ``char``: the first character where the texts part (``None`` for a token divergence of prefix texts);
    ``token``: the first token where the token ids part; ``shared`` the text both hold just before, ``earlier``
    and ``later`` how each continues (decoded tokens for a token divergence)."""

    case: int
    kind: str
    turn: int
    appended: tuple
    roles: tuple
    char: Optional[int]
    token: Optional[int]
    shared: str
    earlier: str
    later: str

    def describe(self) -> str:
        where = (f"message {self.appended[0]}" if len(self.appended) == 1
                 else f"messages {self.appended[0]}..{self.appended[-1]}")
        what = (f"the policy's turn {self.turn}" if self.roles == ("assistant",)
                else f"{where} ({', '.join(self.roles)}) for the prompt of turn {self.turn}")
        at = f"character {self.char}" if self.char is not None else f"token {self.token}"
        changed = "text" if self.kind == "text" else "token ids"
        return (f"case {self.case}, turn {self.turn}: appending {what} changes the {changed} rendered before it at "
                f"{at}: after {self.shared!r} the earlier rendering continues {self.earlier!r}, the longer one "
                f"{self.later!r}")


@dataclass(frozen=True)
class CaseResult:
    """One fuzzed conversation: its features, its first text rewrite and first token divergence (None: none),
    or the template's error when it could not render the conversation."""

    case: int
    features: tuple
    turns: int
    messages: list
    tools: bool
    rewrite: Optional[Divergence] = None
    token_divergence: Optional[Divergence] = None
    error: Optional[str] = None


@dataclass(frozen=True)
class TemplateReport:
    """The check's answer. ``prefix_preserving``: no rendered conversation had a text rewrite (then exact
    concatenation is token-exact); ``token_prefix_preserving``: no token divergence either."""

    seed: int
    supports_tools: bool
    tool_role: bool
    system_role: bool
    cases: tuple = field(default_factory=tuple)

    @property
    def rendered(self) -> list[CaseResult]:
        return [c for c in self.cases if c.error is None]

    @property
    def errors(self) -> list[CaseResult]:
        return [c for c in self.cases if c.error is not None]

    @property
    def rewrites(self) -> list[Divergence]:
        return [c.rewrite for c in self.cases if c.rewrite is not None]

    @property
    def token_divergences(self) -> list[Divergence]:
        return [c.token_divergence for c in self.cases if c.token_divergence is not None and c.rewrite is None]

    @property
    def prefix_preserving(self) -> bool:
        return not self.rewrites

    @property
    def token_prefix_preserving(self) -> bool:
        return self.prefix_preserving and not self.token_divergences

    @property
    def first_rewrite(self) -> Optional[Divergence]:
        r = self.rewrites
        return r[0] if r else None

    def verdict(self) -> str:
        n, k = len(self.rendered), len(self.rewrites)
        if not n:
            return f"the template rendered none of the {len(self.cases)} conversations"
        if k:
            return (f"REWRITES earlier turns in {k} of {n} conversations; first: {self.first_rewrite.describe()}. "
                    "Multi-turn rollouts train one sample per assistant turn with this template (docs/agents.md)")
        tail = "" if self.token_prefix_preserving else (
            f" (in {len(self.token_divergences)} the token ids of a rendering tokenized whole part from the shorter "
            "one's at a boundary; concatenation keeps each part's tokens, so training stays exact)")
        return (f"prefix-preserving in all {n} conversations{tail}: multi-turn rollouts concatenate the turns' "
                "tokens exactly, one sample per episode")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(prefix_preserving=self.prefix_preserving, token_prefix_preserving=self.token_prefix_preserving,
                 rendered=len(self.rendered), rewrites=len(self.rewrites), verdict=self.verdict())
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=1)


# ----------------------------------------------------------------------------------------------- conversations
def _words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(lo, hi)))


def _reasoning(rng: random.Random, style: str, text: str) -> dict:
    """An assistant message with ``text`` as its answer and reasoning in ``style``."""
    if style == "content":
        sep = rng.choice(["\n", "\n\n", ""])
        return {"role": "assistant", "content": f"<think>\n{_words(rng, 2, 9)}\n</think>{sep}{text}"}
    if style == "field":
        return {"role": "assistant", "content": text, "reasoning_content": _words(rng, 2, 9)}
    return {"role": "assistant", "content": text}


def _tool_call(rng: random.Random, i: int, structured: bool, think: str) -> tuple[dict, list[dict]]:
    """An assistant message calling 1-2 tools (hermes text in the content, or OpenAI ``tool_calls``) and the tool
    results answering it."""
    calls = []
    for j in range(rng.randint(1, 2)):
        fn = rng.choice(_TOOLS)["function"]["name"]
        args = {"a": rng.randint(0, 99), "b": rng.randint(0, 99)} if fn == "add" else {"query": _words(rng, 1, 3)}
        calls.append({"id": f"call_{i}_{j}", "type": "function", "function": {"name": fn, "arguments": args}})
    prefix = _words(rng, 0, 4)
    if structured:
        msg = _reasoning(rng, think, prefix)
        msg["tool_calls"] = calls
    else:
        text = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                       "arguments": c["function"]["arguments"]}) + "\n</tool_call>"
                         for c in calls)
        msg = _reasoning(rng, think, f"{prefix}\n{text}" if prefix else text)
    results = [{"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": _words(rng, 1, 5)}
               for c in calls]
    return msg, results


def fuzz_conversation(case: int, seed: int, supports_tools: bool, tool_role: bool = True,
                      system_role: bool = True) -> tuple[list[dict], Optional[list], tuple]:
    """Conversation ``case`` of ``seed``: (messages ending with an assistant turn, tools or None, features).

    The first eight cases of every seed cover the combinations of a system prompt, tool use and reasoning with two
    or more turns; later cases draw every choice."""
    rng = random.Random(f"slick-template-check:{seed}:{case}")
    if case < 8:
        system, tooling, reasoning, turns = bool(case & 1), bool(case & 2), bool(case & 4), rng.randint(2, 4)
    else:
        system, tooling, reasoning = rng.random() < 0.5, rng.random() < 0.5, rng.random() < 0.6
        turns = rng.randint(1, 4)
    system, tooling = system and system_role, tooling and tool_role
    features = [f for f, on in (("system", system), ("tools", tooling), ("reasoning", reasoning)) if on]
    msgs: list[dict] = [{"role": "system", "content": _words(rng, 3, 10)}] if system else []
    styles = ("content", "field", "none") if reasoning else ("none",)
    for t in range(turns):
        msgs.append({"role": "user", "content": _words(rng, 2, 12)})
        if tooling and rng.random() < 0.7:
            structured = supports_tools and rng.random() < 0.5
            call, results = _tool_call(rng, len(msgs), structured, rng.choice(styles))
            msgs += [call] + results
            if structured and "tool_calls" not in features:
                features.append("tool_calls")
        msgs.append(_reasoning(rng, rng.choice(styles), _words(rng, 1, 8)))
    tools = list(_TOOLS) if tooling and supports_tools else None
    return msgs, tools, tuple(features)


# ----------------------------------------------------------------------------------------------- the check
def _text_divergence(case, turn, appended, roles, a: str, b: str) -> Optional[Divergence]:
    if b.startswith(a):
        return None
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return Divergence(case, "text", turn, appended, roles, i, None, a[max(0, i - CONTEXT):i], a[i:i + CONTEXT],
                      b[i:i + CONTEXT])


def _token_divergence(tok, case, turn, appended, roles, a: list, b: list) -> Optional[Divergence]:
    if b[:len(a)] == a:
        return None
    j = 0
    while j < min(len(a), len(b)) and a[j] == b[j]:
        j += 1

    def dec(ids):
        return tok.decode(list(ids), skip_special_tokens=False)
    return Divergence(case, "tokens", turn, appended, roles, None, j, dec(a[max(0, j - 8):j])[-CONTEXT:],
                      dec(a[j:j + 8])[:CONTEXT], dec(b[j:j + 8])[:CONTEXT])


def render_points(messages: Sequence[dict]) -> list[tuple[int, bool, int]]:
    """The points a rollout renders ``messages`` at: ``(number of messages, generation prompt, assistant turn)``,
    before and after every assistant message (the first one's prompt holds every message before it)."""
    out, turn = [], 0
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and i > 0:
            turn += 1
            out += [(i, True, turn), (i + 1, False, turn)]
    return out


def check_conversation(tokenizer, messages: Sequence[dict], tools: Optional[list] = None, case: int = 0,
                       features: tuple = ()) -> CaseResult:
    """Render ``messages`` (ending with an assistant turn) at its render points and compare each rendering with the
    one before: the check of one conversation, fuzzed or written by hand."""
    msgs = [dict(m) for m in messages]
    points = render_points(msgs)
    base = dict(case=case, features=tuple(features), turns=points[-1][2] if points else 0, messages=msgs,
                tools=tools is not None)
    rewrite = token_div = None
    try:
        prev_n, prev_text, prev_ids = None, None, None
        for n, gen, turn in points:
            text = render(tokenizer, msgs[:n], tools, add_generation_prompt=gen)
            ids = encode(tokenizer, text)
            if prev_text is not None:
                appended = tuple(range(prev_n, n))
                roles = tuple(str(msgs[k].get("role")) for k in appended)
                rewrite = rewrite or _text_divergence(case, turn, appended, roles, prev_text, text)
                token_div = token_div or _token_divergence(tokenizer, case, turn, appended, roles, prev_ids, ids)
            prev_n, prev_text, prev_ids = n, text, ids
    except Exception as e:  # noqa: BLE001 - a template that raises on a conversation is reported, not fatal
        return CaseResult(**base, error=f"{type(e).__name__}: {e}")
    return CaseResult(**base, rewrite=rewrite, token_divergence=token_div)


def check_case(tokenizer, case: int, seed: int, supports_tools: bool, tool_role: bool = True,
               system_role: bool = True) -> CaseResult:
    """Fuzzed conversation ``case`` of ``seed`` (:func:`fuzz_conversation`), checked."""
    msgs, tools, features = fuzz_conversation(case, seed, supports_tools, tool_role, system_role)
    return check_conversation(tokenizer, msgs, tools, case, features)


def _renders(tokenizer, messages: list[dict]) -> bool:
    try:
        render(tokenizer, messages, None, add_generation_prompt=True)
        return True
    except Exception:  # noqa: BLE001 - the probe's answer is whether it raises
        return False


def check_template(tokenizer, cases: int = 64, seed: int = 0) -> TemplateReport:
    """Fuzz ``cases`` conversations through ``tokenizer``'s chat template (module doc). Roles the template refuses
    outright (a tool message, a system message: probed first) are left out of the conversations."""
    if cases < 1:
        raise ValueError(f"check_template: cases must be at least 1 (got {cases})")
    supports_tools = template_supports_tools(tokenizer)
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    tool_role = _renders(tokenizer, probe + [{"role": "tool", "tool_call_id": "c", "name": "add", "content": "3"}])
    system_role = _renders(tokenizer, [{"role": "system", "content": "be brief"}] + probe[:1])
    results = tuple(check_case(tokenizer, i, seed, supports_tools, tool_role, system_role) for i in range(cases))
    return TemplateReport(seed, supports_tools, tool_role, system_role, results)


_CACHE: dict[tuple, TemplateReport] = {}


def check_template_cached(tokenizer, cases: int = 32, seed: int = 0) -> TemplateReport:
    """:func:`check_template`, once per (tokenizer path, chat template, cases, seed) in this process."""
    key = (str(getattr(tokenizer, "name_or_path", "")), repr(getattr(tokenizer, "chat_template", None)), cases, seed)
    if key not in _CACHE:
        _CACHE[key] = check_template(tokenizer, cases, seed)
    return _CACHE[key]

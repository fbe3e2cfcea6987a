"""Token deltas of a chat conversation: append messages without re-tokenizing earlier turns.

Multi-turn rollouts keep the policy's sampled tokens exactly as sampled. When tool results (or an
environment's observation, or a user turn) join the conversation, only the *new* text the chat template
renders for them is tokenized, and those tokens are appended after the tokens the engine already saw.
So the token sequence the trainer receives is, by construction, the sequence the engine generated from.

How a delta is computed (:meth:`ChatDelta.append`):

1. The conversation is kept as messages; the policy's turn joins it as ``{"role": "assistant", "content":
   <decoded turn text without its stop token>}``.
2. ``prev`` = the template's text of the conversation so far (no generation prompt), ``new`` = its text of
   the conversation plus the new messages, with the generation prompt. The delta text is
   ``new[len(prev):]``, preceded by what the template closes an assistant turn with (e.g. ``<|im_end|>\\n``)
   minus the stop token the policy already sampled (``<|im_end|>``), so the policy's stop token is kept.
3. The delta text alone is tokenized (no special tokens added) and appended. Earlier turns are rendered
   as text for step 2 only; their tokens are never produced again.

All new messages of one step (e.g. several consecutive tool results) are appended in one call: templates
such as Qwen's group consecutive tool messages under one header and close the group after the last one.

**Templates that rewrite earlier turns** (a system header that counts messages, a template that drops the
reasoning of past assistant turns, one that shows only the last N messages, one that groups messages
differently once more arrive) break the prefix property: ``new`` does not start with ``prev``, or the text
of the conversation after the policy's turn does not start with the text the policy was prompted with.
Then :class:`ChatTemplateRewriteError` names the message and shows where the texts part: a delta is never
made up for a template that has none. The built-in multi-turn rollout fuzzes the template once at start-up
(:mod:`slick.chat.template_check`, ``slick check-template``) and, for a template that rewrites, renders each
turn's prompt afresh (:meth:`ChatDelta.restart`) and trains each turn as a sample of its own
(:mod:`slick.rollout.turn_samples`); SFT masks (:mod:`slick.chat.turns`) still refuse such templates.
"""
from __future__ import annotations

from typing import Optional, Sequence

_SENTINEL = "\u2063SLICKSENTINEL\u2063"


class ChatTemplateRewriteError(ValueError):
    """The chat template renders an earlier part of the conversation differently once messages are added."""


def render(tokenizer, messages: Sequence[dict], tools: Optional[list] = None,
           add_generation_prompt: bool = False) -> str:
    """The chat template's text for ``messages`` (``tools`` passed through when given)."""
    kw = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(list(messages), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **kw)


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` alone, without special tokens added (BOS is never inserted mid-conversation)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _where_parted(a: str, b: str) -> str:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return (f"they agree for {i} characters, then the earlier text continues {a[i:i + 60]!r} "
            f"and the new text {b[i:i + 60]!r}")


def assistant_suffix(tokenizer) -> str:
    """What the template writes after an assistant message's content (``<|im_end|>\\n``, ``<|eot_id|>``).

    Found by rendering a two-message conversation whose assistant content is a sentinel."""
    cache = tokenizer.__dict__.setdefault("_slick_assistant_suffix", {})
    key = getattr(tokenizer, "chat_template", None)
    if key not in cache:
        text = render(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}])
        if _SENTINEL not in text:
            raise ChatTemplateRewriteError("chat template: an assistant message's content does not appear in its "
                                           "rendered text; multi-turn token deltas need a template that renders "
                                           "assistant content verbatim")
        cache[key] = text.rsplit(_SENTINEL, 1)[1]
    return cache[key]


def template_supports_tools(tokenizer) -> bool:
    """Whether the chat template renders a ``tools`` list at all (SmolLM2's does not)."""
    msgs = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "slick_probe_tool", "description": "probe",
                                               "parameters": {"type": "object", "properties": {}}}}]
    try:
        return "slick_probe_tool" in render(tokenizer, msgs, tools=tools, add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that raises on tools does not support them
        return False


class ChatDelta:
    """A conversation as the chat template sees it, grown one step at a time (module doc).

    ``messages`` is the prompt (a list of chat messages), ``tools`` the tool schemas given to the template,
    ``prompt_text`` the text the prompt tokens were encoded from (the template's text with generation prompt;
    rendered here when not given). ``stop_texts`` are the texts of the stop tokens a turn may end with.
    """

    def __init__(self, tokenizer, messages: Sequence[dict], tools: Optional[list] = None,
                 prompt_text: Optional[str] = None):
        self.tok, self.tools = tokenizer, tools
        self.messages = [dict(m) for m in messages]
        self.text = prompt_text if prompt_text is not None else render(tokenizer, self.messages, tools, True)
        self.suffix = assistant_suffix(tokenizer)

    def add_policy_turn(self, token_ids: Sequence[int]) -> str:
        """Record the policy's turn (its sampled tokens, stop token included when it stopped on one).

        Returns the turn's content text (what tool-call parsers read). Nothing is tokenized."""
        full = self.tok.decode(list(token_ids), skip_special_tokens=False)
        content, closing = full, self.suffix
        for t in self._stop_texts(token_ids):  # the policy sampled the start of the template's closing itself
            if t and full.endswith(t) and self.suffix.startswith(t):
                content, closing = full[:-len(t)], self.suffix[len(t):]
                break
        self.messages.append({"role": "assistant", "content": content})
        self._pending_closing = closing
        return content

    def _stop_texts(self, token_ids: Sequence[int]) -> list[str]:
        if not token_ids:
            return []
        last = int(token_ids[-1])
        if last in set(getattr(self.tok, "all_special_ids", []) or []) or last == self.tok.eos_token_id:
            return [self.tok.decode([last], skip_special_tokens=False)]
        return []

    def append(self, new_messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids to append after the policy's last turn for ``new_messages`` (and the next generation prompt).

        Raises :class:`ChatTemplateRewriteError` when the template rewrites what came before."""
        if not self.messages or self.messages[-1]["role"] != "assistant" or not hasattr(self, "_pending_closing"):
            raise ValueError("ChatDelta.append: record the policy's turn with add_policy_turn() first")
        n = len(self.messages)
        prev = render(self.tok, self.messages, self.tools, False)
        if not prev.startswith(self.text):
            raise ChatTemplateRewriteError(
                f"chat template rewrites earlier turns: after the policy's turn (message {n - 1}) the rendered "
                f"conversation no longer starts with the text the policy was prompted with; "
                f"{_where_parted(self.text, prev)}. Token-exact multi-turn rollouts need a template whose text "
                "for a conversation is a prefix of its text for any longer one (docs/agents.md)")
        msgs = self.messages + [dict(m) for m in new_messages]
        new = render(self.tok, msgs, self.tools, add_generation_prompt)
        if not new.startswith(prev):
            roles = ", ".join(m.get("role", "?") for m in new_messages)
            raise ChatTemplateRewriteError(
                f"chat template rewrites earlier turns: appending message(s) {n}..{len(msgs) - 1} ({roles}) "
                f"changes the text of messages 0..{n - 1}; {_where_parted(prev, new)}. Token-exact multi-turn "
                "rollouts need a template whose text for a conversation is a prefix of its text for any longer "
                "one (docs/agents.md)")
        closing = self._pending_closing
        if not prev.endswith(self.suffix):
            closing = ""  # the template ends the turn differently; its own text is in `new` below
        delta_text = closing + new[len(prev):]
        del self._pending_closing
        self.messages = msgs
        self.text = new
        return encode(self.tok, delta_text)

    def restart(self, new_messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """Append ``new_messages`` after the policy's last turn and return the template's text of the whole
        conversation, to be tokenized whole as the next turn's prompt: for templates that rewrite earlier turns,
        where the next turn is a training sample of its own (no prefix check; ``slick.rollout.turn_samples``)."""
        if not self.messages or self.messages[-1]["role"] != "assistant" or not hasattr(self, "_pending_closing"):
            raise ValueError("ChatDelta.restart: record the policy's turn with add_policy_turn() first")
        msgs = self.messages + [dict(m) for m in new_messages]
        text = render(self.tok, msgs, self.tools, add_generation_prompt)
        del self._pending_closing
        self.messages, self.text = msgs, text
        return text

    def state(self) -> dict:
        """JSON-serialisable state (kept in ``sample.metadata`` across partial-rollout aborts)."""
        return {"messages": self.messages, "text": self.text}

    @classmethod
    def from_state(cls, tokenizer, state: dict, tools: Optional[list] = None) -> "ChatDelta":
        d = cls.__new__(cls)
        d.tok, d.tools, d.messages, d.text = tokenizer, tools, [dict(m) for m in state["messages"]], state["text"]
        d.suffix = assistant_suffix(tokenizer)
        return d

"""A whole chat as training tokens: the prompt, then every later turn with a loss mask (1: assistant tokens).

Supervised fine-tuning trains a model on the assistant turns of a chat. The tokens are built the way slick's
multi-turn rollouts build them (:mod:`slick.chat.delta`), so that SFT and RL see one token layout:

1. The prompt is the template's text of the messages before the first assistant message, with the generation
   prompt, encoded without special tokens added (as ``PromptDataset`` encodes chat prompts).
2. Each later message is the *delta* of the template's text: the text of the conversation up to and including
   it, minus the text before it. A message followed by an assistant message is rendered with the generation
   prompt, so the assistant header belongs to the message before it (mask 0), as in a rollout.
3. An assistant delta is the message's content followed by the template's closing of an assistant turn
   (``<|im_end|>\\n``, ``<|eot_id|>``). The content and the closing's stop token (what a policy samples to end
   its turn) get mask 1; the rest of the closing (``\\n``) gets mask 0, as the tool or user delta after a
   sampled turn does in a rollout. Each delta is tokenized alone.

A template whose text for a conversation is not a prefix of its text for a longer one (it rewrites earlier
turns) raises :class:`slick.chat.delta.ChatTemplateRewriteError` naming the message, as multi-turn rollouts do.

Assistant messages with structured ``tool_calls`` are written as the text the policy emits in a rollout
(hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, what ``--tool-parser hermes`` reads),
appended to the content; tool results are ordinary messages with mask 0.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

from slick.chat.delta import ChatTemplateRewriteError, _where_parted, assistant_suffix, encode, render


@dataclass
class ChatTokens:
    """``prompt_ids`` (the context), ``response_ids`` (every later token) and ``loss_mask`` (one per response
    token, 1 on assistant tokens)."""

    prompt_ids: list
    response_ids: list
    loss_mask: list


def tool_call_text(calls: Sequence[dict]) -> str:
    """Structured OpenAI-style ``tool_calls`` as hermes text (one ``<tool_call>`` block per call)."""
    out = []
    for c in calls:
        fn = c.get("function", c) if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"a tool call must be {{'function': {{'name': ..., 'arguments': ...}}}}, got {c!r}")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise ValueError(f"tool call {fn['name']!r}: arguments are not valid JSON: {args[:80]!r}") from None
        out.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args}, ensure_ascii=False)
                   + "\n</tool_call>")
    return "\n".join(out)


def flatten_tool_calls(message: dict) -> dict:
    """``message`` with its ``tool_calls`` written into its content as hermes text (unchanged without them)."""
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    content = message.get("content") or ""
    text = tool_call_text(calls)
    m = {k: v for k, v in message.items() if k != "tool_calls"}
    m["content"] = f"{content}\n{text}" if content else text
    return m


def stop_text(tokenizer) -> str:
    """The leading special token of the template's assistant closing (what a policy samples to end a turn), or
    "" when the closing does not start with one."""
    suffix = assistant_suffix(tokenizer)
    ids = encode(tokenizer, suffix)
    if not ids:
        return ""
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | {tokenizer.eos_token_id}
    return tokenizer.decode([ids[0]], skip_special_tokens=False) if ids[0] in special else ""


def chat_tokens(tokenizer, messages: Sequence[dict], tools: Optional[list] = None) -> ChatTokens:
    """The training tokens of ``messages`` (module doc). Raises ValueError for a chat without an assistant message
    or with nothing before its first one, and ChatTemplateRewriteError for a template that rewrites earlier turns."""
    msgs = [flatten_tool_calls(m) for m in messages]
    roles = [m.get("role") for m in msgs]
    if "assistant" not in roles:
        raise ValueError("the chat has no assistant message: nothing to train on")
    first = roles.index("assistant")
    if first == 0:
        raise ValueError("the chat starts with an assistant message: the prompt before it is empty")
    last = len(roles) - 1 - roles[::-1].index("assistant")
    suffix, stop = assistant_suffix(tokenizer), stop_text(tokenizer)
    prev = render(tokenizer, msgs[:first], tools, add_generation_prompt=True)
    out = ChatTokens(encode(tokenizer, prev), [], [])
    for i in range(first, last + 1):
        gen = i < last and roles[i + 1] == "assistant"
        new = render(tokenizer, msgs[:i + 1], tools, add_generation_prompt=gen)
        if not new.startswith(prev):
            raise ChatTemplateRewriteError(
                f"chat template rewrites earlier turns: adding message {i} ({roles[i]}) changes the text of "
                f"messages 0..{i - 1}; {_where_parted(prev, new)}. SFT masks, like token-exact multi-turn rollouts, "
                "need a template whose text for a conversation is a prefix of its text for any longer one")
        delta = new[len(prev):]
        if roles[i] == "assistant":
            _add_assistant(out, tokenizer, delta, suffix, stop, i)
        else:   # user, tool, system: context, not trained (with the next assistant header when one follows)
            _add(out, encode(tokenizer, delta), 0)
        prev = new
    return out


def _add(out: ChatTokens, ids: list, mask: int) -> None:
    out.response_ids.extend(ids)
    out.loss_mask.extend([mask] * len(ids))


def _add_assistant(out: ChatTokens, tokenizer, delta: str, suffix: str, stop: str, i: int) -> None:
    """An assistant message's delta: content + stop token trained, the rest of the closing not."""
    body, closing = delta, ""
    if suffix and delta.endswith(suffix):
        body, closing = delta[:-len(suffix)] + stop, suffix[len(stop):]
    elif suffix:
        raise ChatTemplateRewriteError(
            f"chat template: assistant message {i} does not end with the template's closing {suffix!r} (its text "
            f"ends {delta[-40:]!r}); SFT masks need a template that closes every assistant turn the same way")
    ids = encode(tokenizer, body)
    if not ids:
        raise ValueError(f"assistant message {i} renders to no tokens")
    _add(out, ids, 1)
    _add(out, encode(tokenizer, closing), 0)

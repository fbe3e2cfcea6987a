"""Chat-template token deltas: golden conversations for several templates, rewrite detection, tool calls."""
import json

import pytest

from slick.chat.delta import ChatDelta, ChatTemplateRewriteError, assistant_suffix, encode, render, \
    template_supports_tools
from slick.chat.toolcall import get_parser, parse_hermes, tools_system_prompt, with_tools_in_system
from tests.chat_templates import COUNTING, DROPS_REASONING, LLAMA3_STYLE, QWEN_STYLE, tokenizer_with

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}},
                                               "required": ["a", "b"]}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def run_conversation(tok, turns, tools=None):
    """Build a conversation token by token the way the multi-turn rollout does.

    ``turns`` alternates policy texts (str, sampled with EOS at the end) and lists of messages answering them.
    Returns (prompt_ids, response_ids, mask, messages, the ids of every policy turn as first produced)."""
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    if tools is not None and not template_supports_tools(tok):
        msgs = with_tools_in_system(msgs, tools)
        tools_arg = None
    else:
        tools_arg = tools
    delta = ChatDelta(tok, msgs, tools_arg)
    prompt = encode(tok, delta.text)
    response, mask, kept = [], [], []
    for item in turns:
        if isinstance(item, str):
            ids = encode(tok, item) + [tok.eos_token_id]
            kept.append((len(response), list(ids)))
            response += ids
            mask += [1] * len(ids)
            assert delta.add_policy_turn(ids) == item
        else:
            ids = delta.append(item)
            response += ids
            mask += [0] * len(ids)
    return prompt, response, mask, delta.messages, kept


@pytest.mark.parametrize("name,template", [("smollm2", None), ("llama3", LLAMA3_STYLE), ("qwen", QWEN_STYLE)])
def test_golden_conversation_matches_full_render(name, template):
    """Tokens built turn by turn decode to exactly the template's text of the whole conversation, and every
    policy turn's tokens sit unchanged where they were sampled (consecutive tool messages in one step)."""
    tok = tokenizer_with(template)
    tool_msgs = [{"role": "tool", "name": "add", "content": "5"}, {"role": "tool", "name": "add", "content": "7"}]
    turns = [CALL, tool_msgs, "Thinking again.\n" + CALL, [{"role": "tool", "name": "add", "content": "5"}],
             "The answer is 5."]
    prompt, response, mask, messages, kept = run_conversation(tok, turns, tools=TOOLS)
    full = prompt + response
    tools_arg = TOOLS if template_supports_tools(tok) else None
    expected = render(tok, messages, tools_arg, add_generation_prompt=False)
    got = tok.decode(full, skip_special_tokens=False)
    # the last turn ends on EOS; the template's text after it (e.g. "\n") is not part of the sample
    suffix = assistant_suffix(tok)
    assert expected == got + suffix[len(tok.eos_token):]
    for start, ids in kept:
        assert response[start:start + len(ids)] == ids
    assert sum(mask) == sum(len(ids) for _, ids in kept)
    assert [m["role"] for m in messages][-6:] == ["assistant", "tool", "tool", "assistant", "tool", "assistant"]
    if name == "qwen":
        assert template_supports_tools(tok) and '"name": "add"' in tok.decode(prompt)
        assert "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n7\n</tool_response>" \
               "<|im_end|>" in got
    else:
        assert not template_supports_tools(tok)
        assert tools_system_prompt(TOOLS) in tok.decode(prompt)


def test_delta_is_tokenized_alone_and_keeps_the_stop_token():
    """SmolLM2: after a turn ending in <|im_end|> the delta starts with the rest of the template's closing ("\\n")."""
    tok = tokenizer_with(None)
    d = ChatDelta(tok, [{"role": "user", "content": "hi"}])
    d.add_policy_turn(encode(tok, "yo") + [tok.eos_token_id])
    ids = d.append([{"role": "tool", "content": "42"}])
    assert tok.decode(ids, skip_special_tokens=False) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    assert ids == encode(tok, "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")


def test_turn_without_stop_token_gets_the_whole_closing():
    tok = tokenizer_with(None)
    d = ChatDelta(tok, [{"role": "user", "content": "hi"}])
    d.add_policy_turn(encode(tok, "cut off mid"))
    ids = d.append([{"role": "user", "content": "go on"}])
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n" \
                                                         "<|im_start|>assistant\n"


def test_state_round_trip_through_json():
    tok = tokenizer_with(QWEN_STYLE)
    d = ChatDelta(tok, [{"role": "user", "content": "hi"}], TOOLS)
    d.add_policy_turn(encode(tok, CALL) + [tok.eos_token_id])
    a = d.append([{"role": "tool", "content": "5"}])
    d2 = ChatDelta.from_state(tok, json.loads(json.dumps(d.state())), TOOLS)
    d.add_policy_turn(encode(tok, "x") + [tok.eos_token_id])
    d2.add_policy_turn(encode(tok, "x") + [tok.eos_token_id])
    assert d.append([{"role": "user", "content": "y"}]) == d2.append([{"role": "user", "content": "y"}])
    assert a


def test_counting_template_is_refused():
    tok = tokenizer_with(COUNTING)
    d = ChatDelta(tok, [{"role": "user", "content": "hi"}])
    d.add_policy_turn(encode(tok, "yo") + [tok.eos_token_id])
    with pytest.raises(ChatTemplateRewriteError, match=r"chat template rewrites earlier turns: after the policy's "
                                                       r"turn \(message 1\).*'1<\|im_end\|>.*'2<\|im_end\|>"):
        d.append([{"role": "tool", "content": "5"}])


def test_template_dropping_reasoning_is_refused():
    """Qwen3-like: an observation in a user message makes the template drop the earlier turn's reasoning."""
    tok = tokenizer_with(DROPS_REASONING)
    d = ChatDelta(tok, [{"role": "user", "content": "guess a number"}])
    d.add_policy_turn(encode(tok, "<think>maybe 4</think>4") + [tok.eos_token_id])
    with pytest.raises(ChatTemplateRewriteError, match=r"appending message\(s\) 2\.\.2 \(user\) changes the text of "
                                                       r"messages 0\.\.1"):
        d.append([{"role": "user", "content": "higher"}])
    # the same template with tool results (no new user message) is exact
    d = ChatDelta(tok, [{"role": "user", "content": "guess a number"}])
    d.add_policy_turn(encode(tok, "<think>maybe 4</think>4") + [tok.eos_token_id])
    assert d.append([{"role": "tool", "content": "higher"}])


def test_append_needs_a_policy_turn_first():
    tok = tokenizer_with(None)
    d = ChatDelta(tok, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="add_policy_turn"):
        d.append([{"role": "tool", "content": "5"}])


def test_hermes_parser():
    text = 'a <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call> b ' \
           '<tool_call>{"name": "mul", "arguments": "{\\"x\\": 2}"}</tool_call>' \
           '<tool_call>{not json}</tool_call><tool_call>{"name": "add", "arguments": [1]}</tool_call><tool_call>{"na'
    calls = parse_hermes(text)
    assert [(c.name, c.arguments, c.error is None) for c in calls[:2]] == [("add", {"a": 1}, True),
                                                                           ("mul", {"x": 2}, True)]
    assert "not valid JSON" in calls[2].error
    assert "must be a JSON object, got list" in calls[3].error
    assert calls[4].error.startswith("unclosed <tool_call>")
    assert parse_hermes("no calls here") == []


def dict_parser(text):
    return [{"name": "echo", "arguments": {"text": text}}] if text else []


def test_parser_by_dotted_path():
    parse = get_parser("tests.test_chat_delta:dict_parser")
    (c,) = parse("hello")
    assert (c.name, c.arguments, c.error) == ("echo", {"text": "hello"}, None)
    with pytest.raises(ValueError, match="--tool-parser 'tests.nope:fn': module 'tests.nope' not found"):
        get_parser("tests.nope:fn")


def test_turn_ending_on_another_special_token_keeps_it():
    """A turn cut right after a special token that does not start the template's closing keeps it as content."""
    tok = tokenizer_with(None)
    d = ChatDelta(tok, [{"role": "user", "content": "hi"}])
    start = tok.convert_tokens_to_ids("<|im_start|>")
    assert d.add_policy_turn(encode(tok, "yo") + [start]) == "yo<|im_start|>"
    ids = d.append([{"role": "tool", "content": "1"}])
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_end|>\n<|im_start|>tool\n1<|im_end|>\n" \
                                                         "<|im_start|>assistant\n"

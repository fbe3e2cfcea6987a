"""Forced tool calls always parse, stop after one call unless parallel calls were asked for, and never leak a
call that a length limit cut off: through a real `slick serve` on the tiny random model (which never wants to end
a string or an object) and the real openai and anthropic clients."""
import json

import anthropic
import openai
import pytest

from slick.chat.toolcall import before_unclosed_call, parse_hermes
from slick.serve.openai_constraints import MAX_PARALLEL_CALLS, closed_objects
from slick.serve.openai_protocol import split_tool_calls

pytestmark = pytest.mark.timeout(300)

# the tool of the report: a named call of get_time, T=1, 80 tokens; its schema says nothing of other keys
GET_TIME = {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone.",
                                             "parameters": {"type": "object", "required": ["tz"], "properties": {
                                                 "tz": {"type": "string", "maxLength": 16}}}}}
NAMED = {"type": "function", "function": {"name": "get_time"}}
MSGS = [{"role": "user", "content": "What time is it in Paris?"}]
# what SmolLM2 wrote for that call at seed 2: the closing tag inside a JSON string used to end the call there
REPORTED = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "]}</tool_call> 1"}}\n</tool_call>'


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def _tz_ok(arguments: str) -> bool:
    args = json.loads(arguments)
    return list(args) == ["tz"] and isinstance(args["tz"], str) and len(args["tz"]) <= 16


def test_the_reported_answer_parses_as_one_call():
    (call,) = parse_hermes(REPORTED)
    assert (call.name, call.arguments, call.error) == ("get_time", {"tz": "]}</tool_call> 1"}, None)
    content, calls = split_tool_calls(REPORTED, parse_hermes)
    assert content is None and [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
        [("get_time", '{"tz": "]}</tool_call> 1"}')]


def test_a_cut_call_is_dropped_not_returned_as_content():
    cut = REPORTED + '\n<tool_call>\n{"name": "get_time", "argu'
    assert before_unclosed_call(cut) == REPORTED + "\n"
    assert before_unclosed_call("Sure. <tool_call>{") == "Sure. " and before_unclosed_call("no call") == "no call"
    content, calls = split_tool_calls(cut, parse_hermes, cut=True)
    assert content is None and len(calls) == 1
    assert split_tool_calls('<tool_call>\n{"name": "get', parse_hermes, cut=True) == (None, [])
    assert split_tool_calls("Let me see.\n<tool_call>\n{", parse_hermes, cut=True) == ("Let me see.\n", [])
    # without a length cut an unclosed call is the policy's own text: it stays
    assert split_tool_calls("Let me see.\n<tool_call>\n{", parse_hermes) == ("Let me see.\n<tool_call>\n{", [])


def test_tool_arguments_are_closed_to_the_listed_properties():
    assert closed_objects(GET_TIME["function"]["parameters"]) == {
        "type": "object", "required": ["tz"], "properties": {"tz": {"type": "string", "maxLength": 16}},
        "additionalProperties": False}
    nested = {"type": "object", "properties": {"where": {"type": "object", "properties": {"city": {}}},
                                               "tags": {"type": "array", "items": {"properties": {"k": {}}}},
                                               "properties": {"type": "object", "properties": {"x": {}}}},
              "$defs": {"P": {"properties": {"a": {}}}}, "enum": [{"properties": {"keep": 1}}]}
    out = closed_objects(nested)
    assert out["additionalProperties"] is False and out["enum"] == nested["enum"]
    assert out["properties"]["where"]["additionalProperties"] is False
    assert out["properties"]["tags"]["items"]["additionalProperties"] is False
    assert out["properties"]["properties"]["additionalProperties"] is False     # a property named "properties"
    assert set(out["properties"]) == {"where", "tags", "properties"}
    assert out["$defs"]["P"]["additionalProperties"] is False
    assert "additionalProperties" not in nested           # a copy
    for left_open in ({"type": "object", "properties": {"a": {}}, "additionalProperties": True},
                      {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}},
                      {"type": "object"},                                           # free-form: no properties
                      {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}):
        assert closed_objects(left_open) == left_open


def test_named_forced_call_always_parses(client):
    """The report's request (seed 2 is choice 2): each choice is one get_time call. The tiny model used to add keys
    to the arguments until the 80 tokens ran out, and the cut call came back as content with no tool_calls."""
    r = client.chat.completions.create(model="m", messages=MSGS, tools=[GET_TIME], tool_choice=NAMED, n=3, seed=0,
                                       temperature=1.0, max_tokens=80)
    for ch in r.choices:
        assert (ch.finish_reason, ch.message.content, len(ch.message.tool_calls)) == ("tool_calls", None, 1), ch
        assert ch.message.tool_calls[0].function.name == "get_time"
        assert _tz_ok(ch.message.tool_calls[0].function.arguments), ch.message.tool_calls[0].function.arguments


def test_parallel_forced_calls_cut_by_length_leak_no_markup(client):
    """parallel_tool_calls: true and a max_tokens that ends the answer inside a call: the complete calls come back,
    the cut one is dropped (content null), finish_reason says "length"; streamed the same."""
    kw = dict(model="m", messages=MSGS, tools=[GET_TIME], tool_choice="required", parallel_tool_calls=True,
              temperature=1.0, max_tokens=45, seed=3)
    r = client.chat.completions.create(n=4, **kw)
    counts = []
    for ch in r.choices:
        assert ch.message.content is None, ch.message.content
        assert all(c.function.name == "get_time" and _tz_ok(c.function.arguments) for c in ch.message.tool_calls or [])
        counts.append((ch.finish_reason, len(ch.message.tool_calls or [])))
    assert all(1 <= k < MAX_PARALLEL_CALLS for _, k in counts) and ("length", 1) in counts, counts
    chunks = list(client.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert text == "" and calls and chunks[-1].choices[0].finish_reason in ("length", "tool_calls")


def test_responses_required_is_one_call_and_a_cut_one_is_no_message(server):
    tool = {"type": "function", "name": "get_time", "parameters": GET_TIME["function"]["parameters"]}
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        r = c.responses.create(model="m", input="What time is it?", tools=[tool], tool_choice="required",
                               temperature=1.0, max_output_tokens=80)
        assert r.status == "completed" and [o.type for o in r.output] == ["function_call"], r.output
        assert _tz_ok(r.output[0].arguments)
        cut = c.responses.create(model="m", input="What time is it?", tools=[tool], tool_choice="required",
                                 temperature=1.0, max_output_tokens=8)
        assert cut.status == "incomplete" and cut.output == [], cut.output


def test_anthropic_any_is_one_tool_use_and_a_cut_one_is_no_text_block(server):
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    tool = {"name": "get_time", "input_schema": GET_TIME["function"]["parameters"]}
    m = a.messages.create(model="m", max_tokens=80, messages=MSGS, tools=[tool], tool_choice={"type": "any"},
                          extra_body={"temperature": 1.0})
    assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"], m.content
    assert list(m.content[0].input) == ["tz"] and len(m.content[0].input["tz"]) <= 16
    cut = a.messages.create(model="m", max_tokens=8, messages=MSGS, tools=[tool], tool_choice={"type": "any"},
                            extra_body={"temperature": 1.0})
    assert cut.stop_reason == "max_tokens" and cut.content == [], cut.content
    with a.messages.stream(model="m", max_tokens=8, messages=MSGS, tools=[tool], tool_choice={"type": "any"},
                           extra_body={"temperature": 1.0}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content == []

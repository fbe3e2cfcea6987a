"""tool_choice "required" / named and response_format json_object / json_schema by grammar-constrained decoding
in slick's engine (llguidance), through a real `slick serve` and the real `openai` and `langchain-openai`
clients, with a tiny *random* model (the hardest case for a grammar: it never wants to close a brace)."""
import json

import jsonschema
import openai
import pytest

from slick.engine.grammar import GrammarError, llg_grammar
from slick.serve.openai_constraints import constraint
from slick.serve.openai_protocol import OpenAIError

pytestmark = pytest.mark.timeout(600)

MSGS = [{"role": "user", "content": "Describe a person."}]
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age", "tags", "ok"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                     "b": {"type": "integer", "minimum": -99, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "flag", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
        "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300) as c:
        yield c


@pytest.mark.slow
def test_json_schema_100_of_100_at_temperature_1(client):
    r = client.chat.completions.create(model="m", messages=MSGS, n=100, temperature=1.0, max_tokens=120, seed=0,
                                       logprobs=True, response_format={"type": "json_schema", "json_schema": {
                                           "name": "person", "schema": SCHEMA, "strict": True}})
    values = []
    for ch in r.choices:
        assert ch.finish_reason == "stop", ch.message.content
        v = json.loads(ch.message.content)
        jsonschema.validate(v, SCHEMA)
        values.append(json.dumps(v, sort_keys=True))
        # the logprobs are of the masked distribution: a token the grammar forces (a key's name) has logprob 0,
        # where the random model's own distribution gives it about -log(49152) = -10.8
        assert max(x.logprob for x in ch.logprobs.content) > -1e-5
    assert len(set(values)) > 50          # sampled, not one fixed answer


def test_json_object(client):
    r = client.chat.completions.create(model="m", messages=MSGS, n=8, max_tokens=200, seed=1,
                                       response_format={"type": "json_object"})
    done = [c for c in r.choices if c.finish_reason == "stop"]
    assert done and all(isinstance(json.loads(c.message.content), dict) for c in done)


@pytest.mark.parametrize("parallel", [False, None])    # None: not sent; a forced answer is one call either way
@pytest.mark.parametrize("choice,names", [("required", {"add", "flag"}),
                                          ({"type": "function", "function": {"name": "flag"}}, {"flag"})])
def test_forced_tool_calls_always_parse(client, choice, names, parallel):
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    r = client.chat.completions.create(model="m", messages=MSGS, n=20, max_tokens=150, seed=2, tools=TOOLS,
                                       tool_choice=choice, **extra)
    seen = set()
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch.message
        call = ch.message.tool_calls[0]
        tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        seen.add(call.function.name)
    assert seen <= names and seen


def test_parallel_forced_calls_are_bounded_and_all_parse(client):
    """parallel_tool_calls: true lets a forced answer hold 1..MAX_PARALLEL_CALLS calls; the random model, which
    never wants to stop, used to repeat calls up to max_tokens and leave the cut one as content."""
    from slick.serve.openai_constraints import MAX_PARALLEL_CALLS
    r = client.chat.completions.create(model="m", messages=MSGS, n=12, max_tokens=400, seed=4, tools=TOOLS,
                                       tool_choice="required", parallel_tool_calls=True)
    counts = []
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls" and not ch.message.content, ch.message
        for call in ch.message.tool_calls:
            tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        counts.append(len(ch.message.tool_calls))
    assert 1 <= min(counts) and max(counts) <= MAX_PARALLEL_CALLS and max(counts) > 1, counts


def test_langchain_structured_output_and_bound_tool_choice(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="x", model="m", max_tokens=120, max_retries=0, seed=3)
    out = llm.with_structured_output(SCHEMA | {"title": "person"}, method="json_schema").invoke("Who?")
    jsonschema.validate(out, SCHEMA)
    msg = llm.bind_tools([TOOLS[0]], tool_choice="add").invoke("Add 2 and 3")
    assert [c["name"] for c in msg.tool_calls] == ["add"] and set(msg.tool_calls[0]["args"]) == {"a", "b"}


def test_refusals_name_the_field(client):
    with pytest.raises(openai.BadRequestError, match="not in 'tools'"):
        client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(openai.BadRequestError, match="cannot both hold"):
        client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=4, tool_choice="required",
                                       response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense-type"}}})
    with pytest.raises(OpenAIError, match="needs 'tools'"):
        constraint({"tool_choice": "required"}, None)
    with pytest.raises(GrammarError, match="sampling.json_schema is not JSON"):
        llg_grammar("json_schema", "{", "sampling")


def test_response_format_keys_are_honoured_or_refused():
    """instructor's JSON_SCHEMA mode puts the schema beside json_object: it holds; an unknown key is refused by
    name instead of being dropped."""
    small = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    grammar = constraint({"response_format": {"type": "json_object", "schema": small}}, None)
    assert json.loads(grammar["json_schema"])["required"] == ["x"]
    assert json.loads(constraint({"response_format": {"type": "json_object"}}, None)["json_schema"])["type"] == "object"
    with pytest.raises(OpenAIError, match="response_format of type 'json_object' has no field 'schemaa'"):
        constraint({"response_format": {"type": "json_object", "schemaa": small}}, None)
    with pytest.raises(OpenAIError, match="has no field 'strict'"):
        constraint({"response_format": {"type": "json_schema", "strict": True, "json_schema": {"schema": small}}}, None)


def test_responses_text_format_keys_are_honoured_or_refused():
    """/v1/responses text.format: json_schema's own keys reach the grammar, an unknown key or a text option slick
    cannot follow is refused by name instead of being dropped."""
    from slick.serve.responses_api import chat_body

    small = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    out = chat_body({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": small,
                                                       "strict": True, "description": "d"}}})
    assert out["response_format"] == {"type": "json_schema", "json_schema": {"name": "n", "schema": small,
                                                                              "strict": True}}
    with pytest.raises(OpenAIError, match="text.format of type 'json_schema' has no field 'schemaa'"):
        chat_body({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schemaa": small}}})
    with pytest.raises(OpenAIError, match=r"text.verbosity is not supported by slick \(only text.format\)"):
        chat_body({"input": "x", "text": {"verbosity": "low"}})
    instructor = chat_body({"input": "x", "text": {"format": {"type": "json_object", "schema": small}}})
    assert json.loads(constraint(instructor, None)["json_schema"])["required"] == ["x"]

"""Token-by-token streaming of /v1/responses and /v1/messages (and of chat through litellm), driven by the real
`openai`, `anthropic`, `openai-agents` and `litellm` clients against a real `slick serve` on a tiny model: the
deltas add up to the unstreamed greedy answer, more than one delta arrives for a long answer, tool calls stream as
argument deltas, and a client that goes away stops its generation."""
import asyncio
import json

import anthropic
import openai
import pytest
from pydantic import BaseModel, Field

from tests.test_openai_stream import disconnect_mid_stream, metric

pytestmark = pytest.mark.timeout(300)

LONG = 1000                    # output tokens: ~0.5 s on this CPU, so many polls of the streamer (every 0.05 s)
TOOL = {"type": "function", "name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}, "strict": True}


@pytest.fixture(scope="module")
def oai(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def test_responses_stream_is_token_by_token_and_equals_unstreamed(oai):
    kw = dict(model="m", input="Tell me a story.", max_output_tokens=LONG, temperature=0)
    full = oai.responses.create(**kw)
    events = list(oai.responses.create(**kw, stream=True))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert len(deltas) > 1, f"one delta only: not streamed token by token ({kinds})"
    assert "".join(deltas) == full.output_text and full.output_text
    done = events[-1].response
    assert done.output_text == full.output_text and done.status == full.status
    assert done.usage.output_tokens == full.usage.output_tokens
    assert kinds.index("response.output_item.added") < kinds.index("response.output_text.delta") \
        < kinds.index("response.output_text.done") < kinds.index("response.output_item.done")


def test_responses_stream_helper_and_tool_call_argument_deltas(oai):
    with oai.responses.stream(model="m", input="Hi", max_output_tokens=8, temperature=0) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        assert text == s.get_final_response().output_text
    args, added, final = "", [], None      # a forced call: its argument deltas add up to the parsed arguments
    for e in oai.responses.create(model="m", input="add 2 and 3", tools=[TOOL], tool_choice="required",
                                  parallel_tool_calls=False, max_output_tokens=80, stream=True):
        if e.type == "response.function_call_arguments.delta":
            args += e.delta
        elif e.type == "response.output_item.added":
            added.append(e.item.type)
        elif e.type == "response.completed":
            final = e.response
    (fc,) = [o for o in final.output if o.type == "function_call"]
    assert "function_call" in added and fc.name == "add" and args == fc.arguments
    assert set(json.loads(args)) == {"a", "b"}


def test_anthropic_stream_is_token_by_token_and_equals_unstreamed(server):
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    kw = dict(model="m", max_tokens=LONG, extra_body={"temperature": 0},
              messages=[{"role": "user", "content": "Tell me a story."}])
    full = a.messages.create(**kw)
    with a.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    kinds = [e.type for e in events if e.type not in ("text",)]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
    assert len(deltas) > 1, f"one delta only: not streamed token by token ({kinds})"
    assert "".join(deltas) == full.content[0].text == final.content[0].text
    assert final.usage.output_tokens == full.usage.output_tokens and final.stop_reason == full.stop_reason
    assert final.usage.input_tokens == full.usage.input_tokens


def test_anthropic_stream_tool_use_input_json_deltas(server):
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    tool = {"name": "add", "input_schema": TOOL["parameters"]}
    with a.messages.stream(model="m", max_tokens=80, tools=[tool], tool_choice={"type": "tool", "name": "add"},
                           messages=[{"role": "user", "content": "add 2 and 3"}]) as s:
        parts = [e.delta.partial_json for e in s if e.type == "content_block_delta"
                 and e.delta.type == "input_json_delta"]
        final = s.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and use.name == "add" and json.loads("".join(parts)) == use.input
    assert set(use.input) == {"a", "b"}


class Flags(BaseModel):
    flags: list[bool] = Field(min_length=300, max_length=300)   # ~600 tokens, bounded by the grammar


def test_agents_sdk_run_streamed_text_deltas(server):
    """The SDK's default (Responses) model, streamed: the answer (JSON by grammar, so it ends by itself) arrives
    in several text deltas that add up to the parsed output, the same as an unstreamed run's."""
    from agents import Agent, ModelSettings, Runner, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseTextDeltaEvent

    async def main():
        set_tracing_disabled(True)
        set_default_openai_client(AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0),
                                  use_for_tracing=False)
        agent = Agent(name="a", instructions="Tell a story.", model="m", output_type=Flags,
                      model_settings=ModelSettings(max_tokens=1600, temperature=0))
        ran = await Runner.run(agent, "Go.")
        streamed = Runner.run_streamed(agent, "Go.")
        deltas = [e.data.delta async for e in streamed.stream_events()
                  if e.type == "raw_response_event" and isinstance(e.data, ResponseTextDeltaEvent)]
        return ran.final_output, streamed.final_output, deltas

    ran, streamed, deltas = asyncio.run(main())
    assert isinstance(streamed, Flags) and streamed == ran and len(streamed.flags) == 300
    assert len(deltas) > 1 and Flags.model_validate_json("".join(deltas)) == streamed


def test_litellm_completion_stream_equals_unstreamed(server, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")       # litellm fetches nothing at import
    import litellm

    kw = dict(model="openai/m", api_base=server.url + "/v1", api_key="x", max_tokens=LONG, temperature=0,
              messages=[{"role": "user", "content": "Tell me a story."}])
    full = litellm.completion(**kw)
    deltas = [c.choices[0].delta.content for c in litellm.completion(**kw, stream=True)
              if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 1 and "".join(deltas) == full.choices[0].message.content
    assert full.usage.completion_tokens == LONG or full.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": "m", "input": "x", "stream": True, "max_output_tokens": 1900}),
    ("/v1/messages", {"model": "m", "max_tokens": 1900, "stream": True,
                      "messages": [{"role": "user", "content": "x"}]})])
def test_client_disconnect_aborts_generation(server, path, body):
    """A long stream: the client reads the first event and closes; the engine is idle again long before the
    1900 tokens the request asked for."""
    before = metric(server.url, "slick_generation_tokens_total")
    disconnect_mid_stream(server.url, path, body, b"event: ")
    assert metric(server.url, "slick_generation_tokens_total") - before < 1500

"""The Responses API (/v1/responses) through the real openai-agents SDK's default model and the openai client,
and Anthropic's Messages API (/v1/messages) through the real anthropic client, against a real `slick serve`."""
import asyncio
import json

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.test_server import call

pytestmark = pytest.mark.timeout(300)


class Verdict(BaseModel):
    ok: bool
    score: int


def test_agents_sdk_run_and_run_streamed_with_default_client(server):
    from agents import (Agent, ModelSettings, Runner, set_default_openai_client, set_tracing_disabled)
    from openai import AsyncOpenAI

    async def main():
        set_tracing_disabled(True)
        set_default_openai_client(AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0),
                                  use_for_tracing=False)
        agent = Agent(name="judge", instructions="Judge.", model="m", output_type=Verdict,
                      model_settings=ModelSettings(max_tokens=40, temperature=1.0))
        ran = await Runner.run(agent, "Is 2 + 2 = 4?")
        streamed = Runner.run_streamed(agent, "Is 2 + 2 = 4?")
        kinds = [e.type async for e in streamed.stream_events()]
        return ran.final_output, streamed.final_output, kinds

    ran, streamed, kinds = asyncio.run(main())
    assert isinstance(ran, Verdict) and isinstance(streamed, Verdict)      # output_type: parsed by the SDK
    assert "raw_response_event" in kinds


def test_responses_text_tools_and_stream(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
        r = c.responses.create(model="m", input="Hi", max_output_tokens=6, temperature=0)
        assert r.status == "incomplete" and r.usage.output_tokens == 6 and r.output_text
        with c.responses.stream(model="m", input="Hi", max_output_tokens=6, temperature=0) as s:
            deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
            assert "".join(deltas) == s.get_final_response().output_text == r.output_text
        tool = {"type": "function", "name": "flag", "parameters": {
            "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
            "additionalProperties": False}, "strict": True}
        r = c.responses.create(model="m", input=[{"role": "user", "content": "flag it"}], tools=[tool],
                               tool_choice="required", parallel_tool_calls=False, max_output_tokens=60)
        (call,) = [o for o in r.output if o.type == "function_call"]
        assert call.name == "flag" and set(json.loads(call.arguments)) == {"on"}
        # the call and its output go back in: the next turn renders them
        r2 = c.responses.create(model="m", max_output_tokens=3, tools=[tool], input=[
            {"role": "user", "content": "flag it"},
            {"type": "function_call", "call_id": call.call_id, "name": "flag", "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "done"}])
        assert r2.usage.input_tokens > r.usage.input_tokens
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            c.responses.create(model="m", input="x", previous_response_id="resp_1")


def test_anthropic_messages_plain_tool_and_stream(server):
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    m = a.messages.create(model="m", max_tokens=5, extra_body={"temperature": 0}, system="Be brief.",
                          messages=[{"role": "user", "content": "Hi"}])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5 and m.content[0].type == "text"
    with a.messages.stream(model="m", max_tokens=5, extra_body={"temperature": 0}, system="Be brief.",
                           messages=[{"role": "user", "content": "Hi"}]) as s:
        assert s.get_final_message().content[0].text == m.content[0].text
    tool = {"name": "flag", "input_schema": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                             "required": ["on"], "additionalProperties": False}}
    m = a.messages.create(model="m", max_tokens=60, tools=[tool], tool_choice={"type": "tool", "name": "flag"},
                          messages=[{"role": "user", "content": "flag it"}])
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and use.name == "flag" and set(use.input) == {"on"}
    m2 = a.messages.create(model="m", max_tokens=3, tools=[tool], messages=[
        {"role": "user", "content": "flag it"}, {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"}]}])
    assert m2.usage.input_tokens > m.usage.input_tokens
    st, out = call(server.url, "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert st == 400 and out == {"type": "error", "error": {"type": "invalid_request_error",
                                                            "message": "max_tokens: Field required"}}


def test_anthropic_structured_output_by_output_config(server):
    """output_config.format json_schema (Anthropic's structured output) holds on a random model; it was refused."""
    a = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    for _ in range(3):
        m = a.messages.create(model="m", max_tokens=40, messages=[{"role": "user", "content": "Answer."}],
                              extra_body={"output_config": {"format": {"type": "json_schema", "schema": schema}},
                                          "temperature": 1.0})
        value = json.loads(m.content[0].text)
        assert set(value) == {"n", "ok"} and 0 <= value["n"] <= 9 and isinstance(value["ok"], bool), value
    st, out = call(server.url, "/v1/messages", {"model": "m", "max_tokens": 4, "output_config": {"effort": "high"},
                                                "messages": [{"role": "user", "content": "x"}]})
    assert st == 400 and "output_config: effort is not supported" in out["error"]["message"]

"""Streaming (``"stream": true``) of a real `slick serve` driven by the real `openai` and `langchain-openai` clients:
the deltas add up to the unstreamed answer token for token, usage and [DONE] come last, tool calls arrive as
deltas, and a client that goes away stops its generation."""
import http.client
import json
import time
import urllib.parse

import openai
import pytest

from slick.serve.openai_stream import held_back
from tests.test_server import call

pytestmark = pytest.mark.timeout(300)

MSGS = [{"role": "user", "content": "Tell me a story."}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": False}}}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120) as c:
        yield c


def test_chat_stream_equals_unstreamed_greedy(client):
    kw = dict(model="m", messages=MSGS, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2)
    full = client.chat.completions.create(**kw)
    text, lps, usage, finish, n_chunks = "", [], None, None, 0
    for ch in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        n_chunks += 1
        assert ch.object == "chat.completion.chunk"
        if ch.usage is not None:
            assert ch.choices == [] and usage is None
            usage = ch.usage
        for c in ch.choices:
            text += c.delta.content or ""
            lps += c.logprobs.content if c.logprobs and c.logprobs.content else []
            finish = c.finish_reason or finish
    ref = full.choices[0]
    assert text == ref.message.content and finish == ref.finish_reason
    assert [(x.token, x.logprob) for x in lps] == [(x.token, x.logprob) for x in ref.logprobs.content]
    assert [[(t.token, t.logprob) for t in x.top_logprobs] for x in lps] == \
        [[(t.token, t.logprob) for t in x.top_logprobs] for x in ref.logprobs.content]
    assert usage.completion_tokens == full.usage.completion_tokens and n_chunks >= 3


def test_completions_stream_batch_equals_unstreamed(client):
    kw = dict(model="m", prompt=["Once upon", "The cat"], max_tokens=12, temperature=0, n=2)
    full = client.completions.create(**kw)
    got = {}
    for ch in client.completions.create(**kw, stream=True):
        for c in ch.choices:
            got[c.index] = got.get(c.index, "") + c.text
    assert got == {c.index: c.text for c in full.choices} and len(got) == 4


def test_stream_ends_with_done_and_usage_raw(server):
    body = {"model": "m", "messages": MSGS, "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    st, text = call(server.url, "/v1/chat/completions", body)
    events = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    assert st == 200 and events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] <= 5
    first = json.loads(events[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_forced_tool_call_streams_as_tool_call_deltas(client):
    calls = []
    for ch in client.chat.completions.create(model="m", messages=MSGS, max_tokens=80, tools=TOOLS,
                                             tool_choice={"type": "function", "function": {"name": "add"}},
                                             stream=True, seed=4):
        for c in ch.choices:
            calls += c.delta.tool_calls or []
            if c.finish_reason:
                assert c.finish_reason == "tool_calls"
    assert len(calls) == 1 and calls[0].function.name == "add" and calls[0].id.startswith("call_")
    assert set(json.loads(calls[0].function.arguments)) == {"a", "b"}


def test_langchain_stream_equals_invoke(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.url + "/v1", api_key="x", model="m", temperature=0, max_tokens=20,
                     max_retries=0)
    assert "".join(c.content for c in llm.stream("Hello")) == llm.invoke("Hello").content


def metric(url, name) -> float:
    """One value of the server's /metrics."""
    st, text = call(url, "/metrics")
    return float(next(l.split()[1] for l in text.splitlines() if l.startswith(name + " ")))


def disconnect_mid_stream(url: str, path: str, body: dict, first: bytes) -> None:
    """POST a stream, read its first line (which starts with ``first``) and close: the request was running, and
    the engine is idle again within 10 s."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.readline().startswith(first)
    assert metric(url, "slick_num_running_reqs") == 1
    conn.close()
    deadline = time.monotonic() + 10
    while metric(url, "slick_num_running_reqs") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(url, "slick_num_running_reqs") == 0


def test_client_disconnect_aborts_generation(server):
    """A stream that would fill the context: the client reads one chunk and closes; the engine is idle again."""
    disconnect_mid_stream(server.url, "/v1/completions", {"model": "m", "prompt": "x", "ignore_eos": True,
                                                          "stream": True}, b"data: ")   # fills the context


def test_held_back_keeps_possible_stop_and_tool_prefixes():
    assert held_back("Hello wor", ["world"], False) == "Hello "
    assert held_back("Hello world!", ["world"], False) == "Hello "
    assert held_back("say <tool", [], True) == "say "
    assert held_back("say <tool", [], False) == "say <tool"
    assert held_back("caf\ufffd", [], False) == "caf"


def test_agent_session_records_streamed_call_exactly_as_unstreamed(tiny_model_dir):
    """Two agent sessions with the same base seed, one call each (streamed / not): the recorded calls match."""
    import asyncio

    from aiohttp import web

    from slick.engine.local import LocalEngine
    from slick.rollout.agent import AgentSession
    from slick.serve.openai_api import OpenAIEndpoint
    from slick.types import SamplingParams

    class Sessions(dict):
        pass

    async def main():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", max_seq_len=256)
        sessions = Sessions(a=AgentSession("a", eng.tokenizer, SamplingParams(seed=7, max_new_tokens=24), 4),
                            b=AgentSession("b", eng.tokenizer, SamplingParams(seed=7, max_new_tokens=24), 4))
        app = web.Application()
        OpenAIEndpoint(eng, eng.tokenizer, model_name="m", max_context=eng.max_context, vocab_size=eng.vocab_size,
                       eos_ids=eng.eos_ids, sessions=sessions).add_routes(app)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            c = openai.AsyncOpenAI(base_url=url + "/sessions/a/v1", api_key="x", max_retries=0)
            full = await c.chat.completions.create(model="m", messages=MSGS, n=2, logprobs=True)
            c = openai.AsyncOpenAI(base_url=url + "/sessions/b/v1", api_key="x", max_retries=0)
            texts = {}
            async for ch in await c.chat.completions.create(model="m", messages=MSGS, n=2, stream=True):
                for x in ch.choices:
                    texts[x.index] = texts.get(x.index, "") + (x.delta.content or "")
        finally:
            await runner.cleanup()
            await eng.close()
        return full, texts, sessions

    full, texts, sessions = asyncio.run(main())
    (ca,), (cb,) = sessions["a"].calls, sessions["b"].calls
    assert ca.prompt_ids == cb.prompt_ids and len(ca.choices) == len(cb.choices) == 2
    for x, y in zip(ca.choices, cb.choices):
        assert (x.token_ids, x.logprobs, x.weight_versions, x.finish_reason, x.message) == \
               (y.token_ids, y.logprobs, y.weight_versions, y.finish_reason, y.message)
    assert texts == {c.index: c.message.content for c in full.choices}

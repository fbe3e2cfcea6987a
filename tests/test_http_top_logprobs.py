"""``top_logprobs`` through HTTP engines: an agent session's OpenAI endpoint in front of an ``HttpEngine`` driving a
real `slick serve` answers them (SGLang's ``top_logprobs_num`` / ``output_top_logprobs``) with the values the
server's own /v1 route gives; vLLM's per-token candidates are read by rank; an engine that sends none is refused
by name."""
import asyncio

import openai
import pytest
from aiohttp import web
from transformers import AutoTokenizer

from slick.engines.client import HttpEngine
from slick.engines.router import launch_workers
from slick.engines.vllm_client import top_logprobs, vllm_sampling
from slick.rollout.agent import AgentSession
from slick.serve.openai_api import OpenAIEndpoint, OpenAIError, _tops
from slick.serve.openai_protocol import Params
from slick.types import Generation, SamplingParams

pytestmark = pytest.mark.timeout(300)

MSGS = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    yield w
    w.stop()


def _pairs(content):
    return [(x.token, [(t.token, t.logprob) for t in x.top_logprobs]) for x in content]


def test_agent_session_over_http_engine_returns_top_logprobs(tiny_model_dir, worker):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    async def main():
        eng = HttpEngine([worker.url])
        sessions = {"a": AgentSession("a", tok, SamplingParams(temperature=0, max_new_tokens=12), 4)}
        app = web.Application()
        OpenAIEndpoint(eng, tok, model_name="m", vocab_size=len(tok), eos_ids=[tok.eos_token_id],
                       sessions=sessions).add_routes(app)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        kw = dict(model="m", messages=MSGS, max_tokens=12, logprobs=True, top_logprobs=3)
        try:
            c = openai.AsyncOpenAI(base_url=url + "/sessions/a/v1", api_key="x", max_retries=0)
            via_http = await c.chat.completions.create(**kw)
            d = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="x", max_retries=0)
            direct = await d.chat.completions.create(**kw, temperature=0)
        finally:
            await runner.cleanup()
            await eng.close()
        return via_http, direct, sessions["a"]

    via_http, direct, session = asyncio.run(main())
    got, want = via_http.choices[0].logprobs.content, direct.choices[0].logprobs.content
    assert len(got) == 12 and all(len(x.top_logprobs) == 3 for x in got)
    assert _pairs(got) == _pairs(want)                  # the server's own values, token for token
    for x in got:                                       # most likely first; greedy: the token is the top one
        lps = [t.logprob for t in x.top_logprobs]
        assert lps == sorted(lps, reverse=True) and x.top_logprobs[0].token == x.token
    (call,) = session.calls                             # recorded as every agent call is
    assert len(call.choices[0].token_ids) == 12


def test_http_engine_top_logprobs_streamed_and_not(worker):
    """``HttpEngine.generate`` with ``top_logprobs_num``, plain and streamed (--use-fault-tolerance): the same
    candidates, the sampled (greedy) token first."""
    sp = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True, top_logprobs_num=2)

    async def main():
        outs = []
        for ft in (False, True):
            eng = HttpEngine([worker.url])
            eng.fault_tolerant = ft
            try:
                outs.append(await eng.generate([1, 2, 3, 4], sp))
            finally:
                await eng.close()
        return outs

    plain, streamed = asyncio.run(main())
    assert plain.token_ids == streamed.token_ids and len(plain.top_logprobs) == 8
    assert plain.top_logprobs == streamed.top_logprobs
    for row, t, lp in zip(plain.top_logprobs, plain.token_ids, plain.logprobs):
        assert len(row) == 2 and row[0][0] == t and row[0][1] == pytest.approx(lp, abs=1e-4)   # own kernel: ~1e-6


def test_vllm_top_logprobs_by_rank():
    """vLLM lists the sampled token first, then the candidates, cut at ``logprobs`` entries: slick asks one more."""
    assert vllm_sampling(SamplingParams(top_logprobs_num=3))["logprobs"] == 4
    assert vllm_sampling(SamplingParams(top_logprobs_num=20))["logprobs"] == 20
    assert vllm_sampling(SamplingParams())["logprobs"] == 0
    choice = {"token_ids": [7, 9], "logprobs": {"content": [
        {"token_id": 7, "logprob": -5.0, "rank": 6, "top_logprobs": [
            {"token_id": 7, "logprob": -5.0, "rank": 6}, {"token_id": 1, "logprob": -0.5, "rank": 1},
            {"token_id": 2, "logprob": -1.5, "rank": 2}, {"token_id": 3, "logprob": -2.5, "rank": 3}]},
        {"token_id": 9, "logprob": -0.1, "rank": 1, "top_logprobs": [
            {"token_id": 9, "logprob": -0.1, "rank": 1}, {"token_id": 4, "logprob": -3.0, "rank": 2},
            {"token_id": 5, "logprob": -4.0, "rank": 3}, {"token_id": 6, "logprob": -4.5, "rank": 4}]}]}}
    assert top_logprobs(choice) == [[(1, -0.5), (2, -1.5), (3, -2.5), (7, -5.0)],
                                    [(9, -0.1), (4, -3.0), (5, -4.0), (6, -4.5)]]
    assert top_logprobs({"logprobs": {"content": [{"token_id": 1, "logprob": -1.0}]}}) is None


def test_engine_without_top_logprobs_is_refused_by_name():
    p = Params()
    p.top_logprobs = 2
    gen = Generation([5, 6], [-1.0, -2.0], "stop")
    with pytest.raises(OpenAIError, match=r"\(HttpEngine\) returned no top logprobs"):
        _tops(gen, p, 2, HttpEngine(["http://127.0.0.1:1"]))
    gen.top_logprobs = [[(5, -1.0)], [(6, -2.0)]]
    assert _tops(gen, p, 1, None) == [[(5, -1.0)]]

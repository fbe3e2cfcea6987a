"""SglangEngine against one real SGLang server slick launched on this CPU (.venv-sglang, `make sglang`): logprobs
equal Hugging Face's in fp32, tokens exact across pause/continue and abort + resubmit, a weight update that lands
(version verified through the route the server has) and a refused one that changes nothing, per-token versions of a
request resumed across an update, prompt logprobs for the mismatch probe, and SGLang's own error for a bad option.

Without .venv-sglang these tests fail (CI sets SLICK_REQUIRE_SGLANG=1) or skip with the command that installs it."""
import asyncio
import contextlib
import os
import time

import pytest
import torch

from slick.engines.client import EngineError
from slick.engines.sglang_client import SglangEngine
from slick.engines.sglang_launch import launch_sglang
from slick.engines.vllm_launch import engine_python
from slick.weights.transport.disk import write_weights_dir
from slick.types import SamplingParams

pytestmark = pytest.mark.slow
PROMPT = list(range(100, 140))


def need_sglang() -> str:
    try:
        return engine_python(None, "sglang")
    except FileNotFoundError as e:
        if os.environ.get("SLICK_REQUIRE_SGLANG"):
            pytest.fail(str(e))
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def sglang_model_dir(tmp_path_factory):
    """A tiny random Llama (head_dim 64), fp32, with SmolLM2's tokenizer."""
    from slick.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-sglang"), hidden_size=128, num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def server(sglang_model_dir):
    need_sglang()
    (proc,) = launch_sglang(str(sglang_model_dir), 1, dtype="float32", startup_timeout=300)
    try:
        yield proc
    finally:
        proc.stop()


def _run(coro_fn, proc):
    async def go():
        eng = SglangEngine([proc.url], api_key=proc.api_key)
        try:
            return await coro_fn(eng)
        finally:
            await eng.close()
    return asyncio.run(go())


def _hf(model_dir, named=None):
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if named is not None:
        m.load_state_dict(dict(named), strict=False)
        m.tie_weights()
    return m


def _hf_logprobs(model, prompt, tokens):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_tokens_and_logprobs_survive_pause_abort_and_resubmit(server, sglang_model_dir):
    greedy = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)

    async def go(eng):
        whole = await eng.generate(PROMPT, greedy)
        long = SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)
        task = asyncio.ensure_future(eng.generate(PROMPT, long, rid="paused"))
        await asyncio.sleep(0.3)
        await eng.pause_generation()
        await asyncio.sleep(0.5)
        done_while_paused = task.done()
        await eng.continue_generation()
        paused = await task
        for attempt in range(6):      # an abort before the first token (a slow prefill) is tried again later
            task = asyncio.ensure_future(eng.generate(PROMPT, SamplingParams(max_new_tokens=1900, temperature=0.0,
                                                                             ignore_eos=True), rid=f"cut{attempt}"))
            await asyncio.sleep(0.3 * 2 ** attempt)
            await eng.abort(f"cut{attempt}")
            cut = await task
            if cut.token_ids:
                break
        rest = await eng.generate(PROMPT + cut.token_ids,
                                  SamplingParams(max_new_tokens=64 - len(cut.token_ids), temperature=0.0,
                                                 ignore_eos=True)) if len(cut.token_ids) < 64 else None
        return whole, done_while_paused, paused, cut, rest

    whole, done_while_paused, paused, cut, rest = _run(go, server)
    assert len(whole.token_ids) == 64 and whole.finish_reason == "length"
    assert whole.weight_version == 0 and whole.weight_versions == [0] * 64     # launched as version 0
    assert not done_while_paused
    assert len(paused.token_ids) == 1500 and paused.token_ids[:64] == whole.token_ids
    assert cut.finish_reason == "abort" and 0 < len(cut.token_ids) < 1900
    joined = cut.token_ids + (rest.token_ids if rest is not None else [])
    assert joined[:64] == whole.token_ids
    # the trainer's convention: log softmax of the logits (greedy: untempered); fp32 on both sides
    ref = _hf_logprobs(_hf(sglang_model_dir), PROMPT, whole.token_ids)
    assert (ref - torch.tensor(whole.logprobs)).abs().max().item() < 2e-4


def test_an_update_lands_on_the_server_and_a_refused_one_changes_nothing(server, sglang_model_dir, tmp_path):
    from safetensors.torch import load_file
    base = load_file(str(sglang_model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items()}   # the tied head moves too
    path = write_weights_dir(tmp_path / "w", 7, iter(new.items()), bucket_bytes=1 << 20)   # several shards
    sampling = SamplingParams(max_new_tokens=16, temperature=0.0)

    async def go(eng):
        before = await eng.generate(PROMPT, sampling)
        v = await eng.update_weights(path=str(path), version=7)
        gen = await eng.generate(PROMPT, sampling)
        with pytest.raises(EngineError, match="update_weights_from_disk"):
            await eng.update_weights(path=str(tmp_path / "missing"), version=9)
        after = await eng.generate(PROMPT, sampling)
        top = await eng.prompt_top_logprobs(PROMPT + gen.token_ids, 20)
        return before, v, gen, after, await eng.weight_version_of(server.url), eng._version_route, top

    before, v, gen, after, version, routes, top = _run(go, server)
    assert routes == {server.url: "/get_model_info"}      # SGLang 0.5.23 has no /get_weight_version
    assert v == 7 and version == 7 and gen.weight_versions == [7] * 16
    assert gen.token_ids != before.token_ids
    ref = _hf_logprobs(_hf(sglang_model_dir, new.items()), PROMPT, gen.token_ids)
    assert (ref - torch.tensor(gen.logprobs)).abs().max().item() < 2e-4
    assert after.token_ids == gen.token_ids and after.weight_versions == [7] * 16
    # the full-vocabulary probe: SGLang's top-20 prompt logprobs against the new weights (fp32: roundings only)
    # and against the old ones (the probe sees the difference)
    from slick.algo.correction import coarse_kl
    from slick.train.probe import candidate_logprobs
    assert len(top) == len(PROMPT) + 16 - 1
    for weights, lo, hi in ((new, 0.0, 1e-6), (base, 1e-3, 10.0)):
        mine = candidate_logprobs(_hf(sglang_model_dir, weights.items()), PROMPT + gen.token_ids,
                                  [list(d) for d in top], "cpu", contextlib.nullcontext())
        kl = [coarse_kl(a, b) for a, b in zip(top, mine)]
        assert lo <= max(kl) < hi, (lo, max(kl))


def test_a_request_paused_across_an_update_carries_each_tokens_version(server, sglang_model_dir, tmp_path):
    """Partial rollout: tokens before the update keep version 8, those after it get 9 (in-place pause), and an
    aborted request resumed from its tokens keeps theirs."""
    from safetensors.torch import load_file
    base = load_file(str(sglang_model_dir / "model.safetensors"))
    new = {k: v * 1.1 for k, v in base.items()}
    path = write_weights_dir(tmp_path / "w", 9, iter(new.items()), bucket_bytes=1 << 30)
    first = write_weights_dir(tmp_path / "b", 8, iter(base.items()), bucket_bytes=1 << 30)

    async def go(eng):
        await eng.update_weights(path=str(first), version=8)
        task = asyncio.ensure_future(eng.generate(PROMPT, SamplingParams(max_new_tokens=1900, temperature=0.0,
                                                                         ignore_eos=True), rid="across"))
        await asyncio.sleep(1.0)
        await eng.pause_generation()
        await eng.update_weights(path=str(path), version=9)
        await eng.continue_generation()
        await asyncio.sleep(0.5)
        await eng.abort("across")
        gen = await task
        # the partial rollout resumed: prompt + every token so far, the rest under the new weights
        rest = await eng.generate(PROMPT + gen.token_ids, SamplingParams(max_new_tokens=8, temperature=0.0,
                                                                         ignore_eos=True))
        return gen, rest, eng._no_radix

    gen, rest, no_radix = _run(go, server)
    assert no_radix == {server.url: True}      # detected: the update under a pause needs no flush
    n8 = gen.weight_versions.count(8)
    assert gen.finish_reason == "abort" and 0 < n8 < len(gen.token_ids) < 1900, (n8, len(gen.token_ids))
    assert gen.weight_versions == [8] * n8 + [9] * (len(gen.token_ids) - n8)
    # the tokens before the update are the old weights' (in fp32, HF's within roundings); the resumed ones the new
    # weights' continuation of everything so far. (Those sampled right after the in-place update are not checked
    # against HF: they attend to the prefix's KV cache from the old weights, as an in-place pause means.)
    old = _hf_logprobs(_hf(sglang_model_dir), PROMPT, gen.token_ids[:n8])
    assert (old - torch.tensor(gen.logprobs[:n8])).abs().max().item() < 2e-4
    assert rest.weight_versions == [9] * 8 and len(rest.token_ids) == 8
    ref = _hf_logprobs(_hf(sglang_model_dir, new.items()), PROMPT + gen.token_ids, rest.token_ids)
    assert (ref - torch.tensor(rest.logprobs)).abs().max().item() < 2e-4


def test_a_bad_sglang_option_ends_the_launch_quoting_sglang(sglang_model_dir):
    need_sglang()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="SGLang server .* failed to start: .*unrecognized arguments: "
                                           "--no-such-option 3"):
        launch_sglang(str(sglang_model_dir), 1, options={"no_such_option": "3"}, startup_timeout=120)
    assert time.monotonic() - t0 < 90


def test_agent_sessions_pass_tool_choice_and_json_schema_to_sglang(server, sglang_model_dir):
    """An agent session's OpenAI endpoint in front of a real SGLang server: forced tool calls (tool_choice
    "required" / named) and response_format json_schema reach SGLang's own constrained decoding (llguidance, the
    backend slick launches it with) as grammars; a tiny random model's every answer parses and validates, which it
    would not unconstrained."""
    import json

    import jsonschema
    import openai
    from aiohttp import web
    from transformers import AutoTokenizer

    from slick.rollout.agent import AgentSession
    from slick.serve.openai_api import OpenAIEndpoint
    from tests.test_openai_structured import MSGS, SCHEMA, TOOLS

    tok = AutoTokenizer.from_pretrained(str(sglang_model_dir))

    async def main():
        eng = SglangEngine([server.url], api_key=server.api_key)
        sessions = {"a": AgentSession("a", tok, SamplingParams(temperature=1.0, max_new_tokens=150, seed=3), 8)}
        app = web.Application()
        OpenAIEndpoint(eng, tok, model_name="m", vocab_size=len(tok), eos_ids=[tok.eos_token_id],
                       sessions=sessions).add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/sessions/a/v1", api_key="x",
                               max_retries=0, timeout=300)
        try:
            named = await c.chat.completions.create(model="m", messages=MSGS, n=4, tools=TOOLS,
                                                    tool_choice={"type": "function", "function": {"name": "flag"}})
            required = await c.chat.completions.create(model="m", messages=MSGS, n=4, tools=TOOLS,
                                                       tool_choice="required", parallel_tool_calls=False)
            structured = await c.chat.completions.create(model="m", messages=MSGS, n=4, response_format={
                "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
            return named, required, structured, sessions["a"].calls
        finally:
            await c.close()
            await runner.cleanup()
            await eng.close()

    named, required, structured, calls = asyncio.run(main())
    for r, names in ((named, {"flag"}), (required, {"add", "flag"})):
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch.message
            call = ch.message.tool_calls[0]
            assert call.function.name in names
            tool = next(t for t in TOOLS if t["function"]["name"] == call.function.name)
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    for ch in structured.choices:
        assert ch.finish_reason == "stop", ch.message.content
        jsonschema.validate(json.loads(ch.message.content), SCHEMA)
    assert len(calls) == 3 and all(len(c.choices) == 4 for c in calls)   # every call recorded for training


def test_regex_ebnf_and_json_schema_reach_sglangs_constrained_decoding(server, sglang_model_dir):
    """SglangEngine sends json_schema, regex and ebnf (llguidance Lark, as slick's forced tool calls write it) as
    SGLang's own sampling_params keys: every sample of the random model matches its grammar."""
    import json
    import re

    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(str(sglang_model_dir))
    # n bounded: a random model may write an unbounded integer past max_new_tokens
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "tag": {"type": "string", "maxLength": 5}},
              "required": ["n", "tag"], "additionalProperties": False}
    cases = {"regex": ("[0-9]{3}-[a-c]{2}", lambda t: re.fullmatch("[0-9]{3}-[a-c]{2}", t)),
             "ebnf": ('start: ("yes" | "no") %json {"type": "boolean"}', lambda t: t in ("yestrue", "yesfalse",
                                                                                          "notrue", "nofalse")),
             "json_schema": (json.dumps(schema), lambda t: set(json.loads(t)) == {"n", "tag"}
                             and json.loads(t)["n"] in range(1000) and len(json.loads(t)["tag"]) <= 5)}

    async def go(eng):
        out = {}
        for name, (grammar, _) in cases.items():
            sp = SamplingParams(max_new_tokens=64, temperature=1.0, **{name: grammar})
            gens = await asyncio.gather(*(eng.generate(PROMPT, sp) for _ in range(4)))
            out[name] = [(g.finish_reason, tok.decode(g.token_ids, skip_special_tokens=True)) for g in gens]
        return out
    texts = _run(go, server)
    for name, (_, ok) in cases.items():
        assert all(f == "stop" and ok(t) for f, t in texts[name]), (name, texts[name])

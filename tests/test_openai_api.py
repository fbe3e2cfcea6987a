"""OpenAI-compatible endpoints of a real `slick serve` process, driven by the real `openai` client library."""
import json

import openai
import pytest

from slick.serve.openai_protocol import OpenAIError, parse_params, split_tool_calls
from slick.chat.toolcall import get_parser
from tests.test_server import call

pytestmark = pytest.mark.timeout(300)

MSGS = [{"role": "user", "content": "What is 2 + 3?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                           "parameters": {"type": "object", "properties": {
                                               "a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="anything", max_retries=0, timeout=120) as c:
        yield c


def test_chat_shape_logprobs_usage(client):
    r = client.chat.completions.create(model="any-name", messages=MSGS, max_tokens=6, logprobs=True, seed=1,
                                       extra_body={"return_token_ids": True})
    assert r.object == "chat.completion" and r.model == "any-name" and len(r.choices) == 1
    ch = r.choices[0]
    extra = ch.model_extra
    ids = extra["token_ids"]
    assert ch.message.role == "assistant" and ch.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == len(ids) <= 6
    assert r.usage.prompt_tokens == len(r.model_extra["prompt_token_ids"])
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    n_text = len(ids) - (ch.finish_reason == "stop")        # the stop token is not part of the content
    assert len(ch.logprobs.content) == n_text and all(x.logprob <= 0 for x in ch.logprobs.content)
    assert "".join(x.token for x in ch.logprobs.content) == ch.message.content
    assert extra["weight_versions"] == [0] * len(ids)


def test_chat_tokens_and_logprobs_equal_native_generate(client, server):
    """Same prompt ids and seed through /generate: the same tokens and logprobs."""
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=5, seed=11, logprobs=True,
                                       extra_body={"return_token_ids": True})
    prompt = r.model_extra["prompt_token_ids"]
    st, native = call(server.url, "/generate", {"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 5, "temperature": 1.0, "sampling_seed": 11}})
    assert st == 200
    assert native["output_ids"] == r.choices[0].model_extra["token_ids"]
    lps = [x[0] for x in native["meta_info"]["output_token_logprobs"]]
    assert [x.logprob for x in r.choices[0].logprobs.content] == pytest.approx(lps[:len(r.choices[0].logprobs.content)],
                                                                             abs=1e-6)
    # the prompt is the chat template's rendering of the messages
    from slick.models.tiny import load_demo_tokenizer

    tok = load_demo_tokenizer()
    text = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False)
    assert prompt == tok(text, add_special_tokens=False)["input_ids"]


def test_chat_n_seed_and_max_tokens(client):
    a = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, n=3, seed=5)
    b = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4, n=3, seed=5)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]   # reproducible
    assert len({c.message.content for c in a.choices}) > 1                                    # seed + i differ
    assert a.usage.completion_tokens <= 12
    r = client.chat.completions.create(model="m", messages=MSGS, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_chat_stop_string(client):
    full = client.chat.completions.create(model="m", messages=MSGS, max_tokens=8, temperature=0, logprobs=True)
    pieces = [x.token for x in full.choices[0].logprobs.content]
    stop = pieces[3]
    want = full.choices[0].message.content.split(stop)[0]
    r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=8, temperature=0, stop=[stop])
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"


def test_tools_are_rendered_and_history_with_tool_calls(client):
    """SmolLM2's template ignores tools=: the schemas go into the system message; an assistant message with
    tool_calls and the tool result render as Hermes text and a tool turn."""
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=2,
                                       extra_body={"return_token_ids": True})
    from slick.models.tiny import load_demo_tokenizer

    tok = load_demo_tokenizer()
    text = tok.decode(r.model_extra["prompt_token_ids"])
    assert '"name": "add"' in text and "<tool_call>" in text and text.startswith("<|im_start|>system\n# Tools")
    history = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    r = client.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=2,
                                       extra_body={"return_token_ids": True})
    text = tok.decode(r.model_extra["prompt_token_ids"])
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>' \
        in text
    assert text.endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")


def test_tool_call_response_builder():
    parse = get_parser("hermes")
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    content, calls = split_tool_calls(text, parse)
    assert content == "Let me add."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "add", {"a": 2, "b": 3})]
    assert calls[0]["id"].startswith("call_")
    assert split_tool_calls("<tool_call>{broken</tool_call>", parse) == ("<tool_call>{broken</tool_call>", [])
    assert split_tool_calls("no call", parse) == ("no call", [])


def test_completions_text_ids_batch_logprobs(client):
    r = client.completions.create(model="m", prompt="Hello there", max_tokens=4, logprobs=0, temperature=0)
    ch = r.choices[0]
    assert r.object == "text_completion" and len(ch.logprobs.tokens) == len(ch.logprobs.token_logprobs)
    assert "".join(ch.logprobs.tokens) == ch.text
    assert ch.logprobs.text_offset[0] == 0 and ch.logprobs.top_logprobs is None
    ids = [1, 422, 2014, 314]
    r = client.completions.create(model="m", prompt=[ids, "Hi"], max_tokens=3, n=2, seed=3)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == 4 + 1 and r.usage.completion_tokens <= 12


def test_models(client, tiny_model_dir):
    models = client.models.list()
    assert [m.id for m in models.data] == [str(tiny_model_dir)] and models.data[0].owned_by == "slick"


@pytest.mark.parametrize("body,status,needle,param", [
    (None, 400, "malformed JSON", None),
    ({"messages": MSGS, "stream": "yes"}, 400, "'stream' must be a boolean", "stream"),
    ({"messages": MSGS, "max_tokens": -1}, 400, "'max_tokens' must be >= 1", "max_tokens"),
    ({"messages": MSGS, "top_logprobs": 2}, 400, "'top_logprobs' needs", "top_logprobs"),
    ({"messages": MSGS, "top_logprobs": 21, "logprobs": True}, 400, "between 0 and 20", "top_logprobs"),
    ({"messages": MSGS, "presence_penalty": 0.5}, 400, "presence_penalty", "presence_penalty"),
    ({"messages": MSGS, "tool_choice": "required"}, 400, "needs 'tools'", "tool_choice"),
    ({"messages": MSGS, "response_format": {"type": "xml"}}, 400, "response_format", "response_format"),
    ({"messages": MSGS, "stream_options": {"include_usage": True}}, 400, "only allowed with", "stream_options"),
    ({"messages": MSGS, "frobnicate": 1}, 400, "unrecognized request argument supplied: 'frobnicate'", "frobnicate"),
    ({"messages": []}, 400, "'messages' must be a non-empty list", "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", "messages[0].role"),
    ({"messages": MSGS, "max_tokens": 10 ** 6}, 400, "exceeds the context", "max_tokens"),
])
def test_chat_errors_in_openai_shape(server, body, status, needle, param):
    raw = b"{not json" if body is None else None
    st, out = call(server.url, "/v1/chat/completions", {"model": "unknown-model", **(body or {})}, raw=raw)
    assert st == status, out
    err = out["error"]
    assert needle in err["message"] and err["type"] == "invalid_request_error" and err["param"] == param


def test_errors_reach_the_openai_client(client):
    with pytest.raises(openai.BadRequestError, match="'logprobs' must be between 0 and 5"):
        client.completions.create(model="m", prompt="x", max_tokens=2, logprobs=6)
    with pytest.raises(openai.BadRequestError, match="only null"):
        client.completions.create(model="m", prompt="x", max_tokens=2, extra_body={"response_format": {
            "type": "json_object"}})
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        client.completions.create(model="m", prompt=[10 ** 7], max_tokens=2)


def test_parse_params_defaults_and_refusals():
    p = parse_params({"messages": MSGS}, chat=True)
    assert (p.n, p.max_tokens, p.temperature, p.top_p, p.seed, p.stop, p.logprobs) == (1, None, 1.0, 1.0, None, [],
                                                                                       False)
    p = parse_params({"stop": "x", "max_tokens": 4, "max_completion_tokens": 4, "n": 2, "seed": 9}, chat=True)
    assert (p.stop, p.max_tokens, p.n, p.seed) == (["x"], 4, 2, 9)
    assert p.sampling(4, index=1).seed == 10
    with pytest.raises(OpenAIError, match="disagree"):
        parse_params({"max_tokens": 4, "max_completion_tokens": 5}, chat=True)
    with pytest.raises(OpenAIError, match="'n' must be between 1 and 128"):
        parse_params({"n": 0}, chat=True)
    with pytest.raises(OpenAIError, match="temperature"):
        parse_params({"temperature": 3}, chat=False)
    with pytest.raises(OpenAIError, match="echo"):
        parse_params({"echo": True}, chat=False)

"""What each engine client sends for a constrained request (the real servers are checked in tests/test_vllm_engine.py
and tests/test_sglang_engine.py, slow): vLLM's ``structured_outputs``, SGLang's own ``sampling_params`` keys, and a
constrained generation resumed after a failed worker starts over instead of continuing under a restarted
grammar."""
import json

from slick.engines.fault import PartialGeneration
from slick.engines.sglang_client import SglangEngine
from slick.engines.vllm_client import vllm_sampling
from slick.types import SamplingParams

COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def test_vllm_gets_every_grammar_as_structured_outputs():
    base = {"max_tokens": 5, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 0, "ignore_eos": False,
            "skip_special_tokens": True}
    assert vllm_sampling(SamplingParams(max_new_tokens=5)) == base
    assert vllm_sampling(SamplingParams(max_new_tokens=5, regex="[ab]+")) == {
        **base, "structured_outputs": {"regex": "[ab]+"}}
    assert vllm_sampling(SamplingParams(max_new_tokens=5, ebnf='start: "x"')) == {
        **base, "structured_outputs": {"grammar": 'start: "x"'}}
    assert vllm_sampling(SamplingParams(max_new_tokens=5, json_schema='{"type": "object"}')) == {
        **base, "structured_outputs": {"json": {"type": "object", "x-guidance": COMPACT}}}


def test_sglang_gets_its_own_keys():
    for key, text in (("json_schema", '{"type": "object"}'), ("regex", "[ab]+"), ("ebnf", 'start: "x"')):
        assert SamplingParams(max_new_tokens=5, **{key: text}).to_sglang() == {
            "temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 5, key: text}


def test_sglang_json_schemas_carry_the_compact_json_options():
    """As slick's engine applies them: a random model filled SGLang's JSON with whitespace until the limit."""
    eng = SglangEngine(["http://127.0.0.1:9"])       # nothing is sent: only the body is built
    body = eng._payload([1, 2], SamplingParams(max_new_tokens=5, json_schema='{"type": "object"}'), "r", False)
    assert json.loads(body["sampling_params"]["json_schema"]) == {"type": "object", "x-guidance": COMPACT}
    own = {"type": "object", "x-guidance": {"whitespace_flexible": True}}
    body = eng._payload([1], SamplingParams(max_new_tokens=5, json_schema=json.dumps(own)), "r", False)
    assert json.loads(body["sampling_params"]["json_schema"])["x-guidance"] == {**COMPACT, "whitespace_flexible": True}
    for text in ("{not json", "[1]"):         # the server names a bad schema
        body = eng._payload([1], SamplingParams(max_new_tokens=5, json_schema=text), "r", False)
        assert body["sampling_params"]["json_schema"] == text


def test_a_constrained_generation_starts_over_after_a_failed_worker():
    plain = PartialGeneration()
    plain.add_tokens([7, 8], [-0.5, -0.25], [3, 3], SamplingParams(max_new_tokens=10))
    assert plain.prompt([1, 2]) == [1, 2, 7, 8]
    assert plain.sampling(SamplingParams(max_new_tokens=10)).max_new_tokens == 8
    for key, text in (("json_schema", '{"type": "object"}'), ("regex", "[ab]+"), ("ebnf", 'start: "x"')):
        sp = SamplingParams(max_new_tokens=10, **{key: text})
        part = PartialGeneration()
        part.add_tokens([7, 8], [-0.5, -0.25], [3, 3], sp)
        assert part.prompt([1, 2]) == [1, 2] and part.sampling(sp) == sp and part.tokens == []

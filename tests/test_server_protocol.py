"""SGLang wire format helpers (pure functions): request checks and response parsing."""
import pytest

from slick.serve.http_protocol import (RequestError, generation_from_json, generation_json, parse_generate,
                                        parse_sampling, parse_weight_version)
from slick.types import Generation


def parse(body, **kw):
    return parse_generate(body, vocab_size=100, max_context=32, **kw)


def test_single_and_batch_shapes():
    r = parse({"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0, "max_new_tokens": 4},
               "rid": "a", "extra": 1})
    assert not r.batched and len(r.items) == 1 and r.items[0].rid == "a"
    assert r.items[0].sampling.temperature == 0.0 and r.items[0].sampling.max_new_tokens == 4
    r = parse({"input_ids": [[1], [2, 3]], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}],
               "rid": "b"})
    assert r.batched and [i.prompt_ids for i in r.items] == [[1], [2, 3]]
    assert [i.sampling.max_new_tokens for i in r.items] == [1, 2] and [i.rid for i in r.items] == ["b-0", "b-1"]
    r = parse({"text": ["hi", "yo"]}, tokenize=lambda s: [len(s), 7])
    assert r.batched and r.items[1].prompt_ids == [2, 7]
    assert r.items[0].sampling.max_new_tokens == 30        # default 128 shrinks to the 32-token context


@pytest.mark.parametrize("body,msg", [
    ({"input_ids": [1, 100]}, r"input_ids\[1\] = 100 is outside the vocabulary \[0, 100\)"),
    ({"input_ids": [[1], [True]]}, r"input_ids\[1\]\[0\] must be an integer"),
    ({"input_ids": [1] * 32}, "has 32 tokens; the context is 32"),
    ({"input_ids": [1] * 30, "sampling_params": {"max_new_tokens": 3}}, "prompt 30 \\+ max_new_tokens 3"),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, r"top_p must be in \(0, 1\]"),
    ({"input_ids": [1], "sampling_params": {"top_k": 1.5}}, "top_k must be an integer"),
    ({"input_ids": [1], "sampling_params": {"stop": [1]}}, "stop must be a string"),
    ({"input_ids": [[1], [2]], "sampling_params": [{}]}, "sampling_params list has 1 entries for 2"),
    ({"input_ids": [[1], [2]], "rid": ["x"]}, "rid must be a string or a list of 2"),
    ({"text": "hi"}, "cannot tokenize"),
])
def test_errors_name_the_field(body, msg):
    with pytest.raises(RequestError, match=msg):
        parse(body)


def test_sampling_accepts_integral_floats_and_seed_alias():
    sp = parse_sampling({"max_new_tokens": 8.0, "seed": 4, "stop": "x"})
    assert sp.max_new_tokens == 8 and sp.seed == 4 and sp.stop == ["x"]


def test_response_roundtrip():
    from slick.serve.http_protocol import GenerateItem
    from slick.types import SamplingParams

    gen = Generation([5, 2], [-0.5, -1.25], "stop", 3, 2)
    item = GenerateItem("r1", [1, 9], SamplingParams(max_new_tokens=4))
    d = generation_json(gen, item, text="ab", return_logprob=True, e2e_latency=0.1234567)
    assert d["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert d["meta_info"]["output_token_logprobs"] == [[-0.5, 5, None], [-1.25, 2, None]]
    assert d["meta_info"]["e2e_latency"] == 0.123457
    back = generation_from_json(d)
    assert (back.token_ids, back.logprobs, back.finish_reason, back.weight_version, back.prompt_tokens) == \
        ([5, 2], [-0.5, -1.25], "stop", 3, 2)
    length = generation_json(Generation([5], [-1.0], "length"), item, text="", return_logprob=False, e2e_latency=0)
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


def test_per_token_weight_versions_roundtrip_and_fallback():
    from slick.serve.http_protocol import GenerateItem
    from slick.types import SamplingParams

    item = GenerateItem("r1", [1, 9], SamplingParams(max_new_tokens=4))
    gen = Generation([5, 2, 7], [-0.5, -1.25, -2.0], "length", 4, 2, weight_versions=[3, 4, 4])
    d = generation_json(gen, item, text="", return_logprob=True, e2e_latency=0)
    assert d["meta_info"]["output_token_weight_versions"] == [3, 4, 4]
    assert generation_from_json(d).weight_versions == [3, 4, 4]
    # a real SGLang server sends only the request's version: one per token
    del d["meta_info"]["output_token_weight_versions"]
    d["meta_info"]["weight_version"] = "6"
    assert generation_from_json(d).weight_versions == [6, 6, 6]
    d["meta_info"]["output_token_weight_versions"] = [1, 2]
    with pytest.raises(ValueError, match="2 entries for 3 tokens"):
        generation_from_json(d)
    # no versions known: the field is absent
    assert "output_token_weight_versions" not in generation_json(
        Generation([5], [-1.0], "length"), item, text="", return_logprob=False, e2e_latency=0)["meta_info"]


def test_sample_takes_per_token_versions():
    from slick.types import Sample

    s = Sample()
    s.apply_generation(Generation([1, 2], [-1.0, -1.0], "abort", 3, weight_versions=[2, 3]))
    s.apply_generation(Generation([4, 5, 6], [-1.0] * 3, "length", 5))       # no per-token versions
    assert s.weight_versions == [2, 3, 5, 5, 5] and s.response_ids == [1, 2, 4, 5, 6]
    with pytest.raises(ValueError, match="1 weight_versions for 2 tokens"):
        s.apply_generation(Generation([7, 8], [-1.0] * 2, "length", 5, weight_versions=[5]))
    assert s.response_ids == [1, 2, 4, 5, 6] and len(s.weight_versions) == 5       # unchanged


def test_parses_sglang_style_response_without_output_ids():
    d = {"text": "x", "meta_info": {"id": "q", "finish_reason": {"type": "length", "length": 2},
                                    "prompt_tokens": 4, "weight_version": "default",
                                    "output_token_logprobs": [[-0.1, 11, None], [None, 12, None]]}}
    g = generation_from_json(d)
    assert g.token_ids == [11, 12] and g.logprobs[0] == -0.1 and g.logprobs[1] != g.logprobs[1]  # nan
    assert g.weight_version == 0 and g.finish_reason == "length"
    assert parse_weight_version("12") == 12 and parse_weight_version(None, default=-1) == -1
    with pytest.raises(ValueError, match="not a /generate response"):
        generation_from_json({"error": "boom"})


def test_sampling_params_are_honoured_or_refused_by_name():
    sp = parse_sampling({"ignore_eos": True, "skip_special_tokens": False, "no_stop_trim": True,
                         "temperature": None, "min_p": 0.0, "n": 1, "logit_bias": {}, "stream_interval": 3})
    assert (sp.ignore_eos, sp.skip_special_tokens, sp.no_stop_trim, sp.temperature) == (True, False, True, 1.0)
    assert sp.to_sglang()["ignore_eos"] is True and "no_stop_trim" in sp.to_sglang()
    with pytest.raises(RequestError, match=r"sampling_params\.min_p = 0\.05 is not supported"):
        parse_sampling({"min_p": 0.05})
    with pytest.raises(RequestError, match=r"sampling_params\.n = True is not supported"):
        parse_sampling({"n": True})
    with pytest.raises(RequestError, match=r"sampling_params\.best_of is not an SGLang sampling parameter"):
        parse_sampling({"best_of": 2})


def test_text_sizes_are_checked_before_tokenizing():
    from slick.serve.http_protocol import text_prompts

    calls = []

    def tokenize(s):
        calls.append(s)
        return [1]

    with pytest.raises(RequestError, match="batch of 5 prompts exceeds the limit of 4") as e:
        parse({"text": ["a"] * 5}, tokenize=tokenize, max_batch=4)
    assert e.value.status == 413
    with pytest.raises(RequestError, match=r"text\[1\] has 11 characters; more than 10") as e:
        parse({"text": ["a", "b" * 11]}, tokenize=tokenize, max_text_chars=10)
    assert e.value.status == 413 and calls == []
    assert text_prompts({"text": "hi"}, max_chars=2) == ["hi"]
    assert text_prompts({"input_ids": [1], "text": "x" * 99}, max_chars=2) is None   # input_ids win
    r = parse({"text": ["hi", "yo"]}, text_ids=[[4], [5, 6]])
    assert [i.prompt_ids for i in r.items] == [[4], [5, 6]] and calls == []

"""`slick serve` request handling on a real server: sampling params honoured or refused, size limits checked
before tokenizing (with /health answering meanwhile), and a client that disconnects aborting its request."""
import json
import shutil
import socket
import threading
import time

import pytest
from safetensors.torch import load_file, save_file

from slick.serve.http_protocol import DEFAULT_ONLY_SAMPLING
from slick.engines.router import launch_workers
from tests.test_server import PROMPT, _metrics, call, gen_body

pytestmark = pytest.mark.timeout(300)

SPECIAL = 0          # "<|endoftext|>": made the greedy first token, and an EOS of the served model


@pytest.fixture(scope="module")
def eos_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with token 0's embedding set to 3x that of its greedy token (30, logit > 0), so greedy
    decoding emits the special token 0 first; generation_config.json makes token 0 an EOS."""
    d = tmp_path_factory.mktemp("eos") / "model"
    shutil.copytree(tiny_model_dir, d)
    sd = load_file(str(d / "model.safetensors"))
    emb = sd["model.embed_tokens.weight"]
    emb[SPECIAL] = emb[30] * 3
    save_file(sd, str(d / "model.safetensors"))
    gc = json.loads((d / "generation_config.json").read_text())
    gc["eos_token_id"] = [2, SPECIAL]
    (d / "generation_config.json").write_text(json.dumps(gc))
    return d


@pytest.fixture(scope="module")
def server(eos_model_dir):
    # the old 64 MiB body limit, so that the character limit and long tokenizing are what these tests reach
    (w,) = launch_workers(eos_model_dir, 1, dtype="fp32", startup_timeout=240,
                          extra_args=["--max-request-bytes", str(64 << 20)])
    yield w
    w.stop()


def generate(url, n=8, **sp):
    st, out = call(url, "/generate", gen_body(n=n, sp=sp))
    assert st == 200, out
    return out


# ------------------------------------------------------------------ sampling params
def test_ignore_eos_generates_max_new_tokens(server):
    stop = generate(server.url, n=8)
    assert stop["output_ids"] == [SPECIAL] and stop["meta_info"]["finish_reason"]["type"] == "stop"
    ign = generate(server.url, n=8, ignore_eos=True)
    assert len(ign["output_ids"]) == 8 and ign["output_ids"][0] == SPECIAL
    assert ign["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    # as in SGLang, ignore_eos also ignores stop_token_ids (stop strings still stop)
    ign = generate(server.url, n=8, ignore_eos=True, stop_token_ids=[ign["output_ids"][1]])
    assert len(ign["output_ids"]) == 8


def test_skip_special_tokens_and_no_stop_trim_shape_the_text(server):
    name = "<|endoftext|>"
    assert name not in generate(server.url, n=4, ignore_eos=True)["text"]
    assert generate(server.url, n=4, ignore_eos=True, skip_special_tokens=False)["text"].startswith(name)
    # stopped by the EOS token: SGLang trims it from the text unless no_stop_trim
    assert generate(server.url, skip_special_tokens=False)["text"] == ""
    assert generate(server.url, skip_special_tokens=False, no_stop_trim=True)["text"] == name
    # stopped by a stop string: trimmed likewise
    out = generate(server.url, ignore_eos=True, skip_special_tokens=False, stop=[name])
    assert out["output_ids"] == [SPECIAL] and out["text"] == ""
    out = generate(server.url, ignore_eos=True, skip_special_tokens=False, stop=[name], no_stop_trim=True)
    assert out["text"] == name


NOT_DEFAULT = {"min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.2,
               "min_new_tokens": 2, "n": 2, "json_schema": '{"type": "object"}', "regex": "a+", "ebnf": "x",
               "structural_tag": "{}", "stop_regex": "\\d", "logit_bias": {"5": 10.0}}


@pytest.mark.parametrize("key", sorted(DEFAULT_ONLY_SAMPLING))
def test_unsupported_sampling_param_is_refused_naming_it(server, key):
    st, out = call(server.url, "/generate", gen_body(n=2, sp={key: NOT_DEFAULT[key]}))
    assert st == 400 and f"sampling_params.{key} = " in out["error"], out
    default = DEFAULT_ONLY_SAMPLING[key]
    assert call(server.url, "/generate", gen_body(n=2, sp={key: default}))[0] == 200   # the default passes


def test_unknown_and_null_sampling_params(server):
    st, out = call(server.url, "/generate", gen_body(n=2, sp={"temprature": 0.5}))
    assert st == 400 and "sampling_params.temprature is not an SGLang sampling parameter" in out["error"]
    st, out = call(server.url, "/generate", {"input_ids": [PROMPT, PROMPT],
                                             "sampling_params": [{"max_new_tokens": 2}, {"best_of": 3}]})
    assert st == 400 and "sampling_params[1].best_of" in out["error"]
    st, out = call(server.url, "/generate", gen_body(n=2, sp={"ignore_eos": "yes"}))
    assert st == 400 and "sampling_params.ignore_eos must be a boolean" in out["error"]
    # null means the default, as in SGLang; no-effect fields are accepted
    st, out = call(server.url, "/generate", gen_body(n=3, sp={"top_k": None, "top_p": None, "min_p": None,
                                                               "spaces_between_special_tokens": False,
                                                               "stream_interval": 4, "custom_params": {"a": 1}}))
    assert st == 200 and out["output_ids"] == [SPECIAL], out


# ------------------------------------------------------------------ size limits
def _max_text_chars(eos_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(eos_model_dir))
    return max(len(t) for t in tok.get_vocab()) * (2048 - 1)


def test_oversized_text_is_refused_before_tokenizing(server, eos_model_dir):
    limit = _max_text_chars(eos_model_dir)
    t0 = time.monotonic()
    st, out = call(server.url, "/generate", {"text": "a" * 20_000_000, "sampling_params": {"max_new_tokens": 1}})
    took = time.monotonic() - t0
    assert st == 413 and f"more than {limit} cannot fit" in out["error"], out
    assert took < 5.0          # tokenizing these 20 MB takes ~15 s on this machine
    st, out = call(server.url, "/generate", {"text": ["hi"] * 20_000})
    assert st == 413 and "batch of 20000 prompts exceeds the limit of 4096" in out["error"]
    st, out = call(server.url, "/generate", {"text": ["hi", "b" * (limit + 1)]})
    assert st == 413 and "text[1] has" in out["error"]
    assert call(server.url, "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}})[0] == 200


def test_health_answers_while_a_large_text_is_tokenized(server, eos_model_dir):
    """60 texts just under the character limit: allowed, ~10 MB to tokenize (seconds), then refused because
    each is longer than the context. /health must keep answering within 2 s meanwhile."""
    limit = _max_text_chars(eos_model_dir)
    chunk = "hello world, "
    texts = [chunk * ((limit - 10) // len(chunk))] * 60
    result = []
    t = threading.Thread(target=lambda: result.append(call(server.url, "/generate", {"text": texts}, timeout=200)))
    t0 = time.monotonic()
    t.start()
    worst, polls = 0.0, 0
    while t.is_alive() and time.monotonic() - t0 < 200:
        s = time.monotonic()
        assert call(server.url, "/health", timeout=30)[0] == 200
        worst = max(worst, time.monotonic() - s)
        polls += 1
        time.sleep(0.05)
    t.join(10)
    (st, out), = result
    assert worst < 2.0, f"/health took {worst:.2f}s while the server tokenized"
    assert polls >= 5, f"the request took {time.monotonic() - t0:.1f}s: too short to measure"
    assert st == 413 and "text[0] (tokenized) has" in out["error"], out


# ------------------------------------------------------------------ client disconnect
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_client_disconnect_aborts_the_request(server, stream):
    n = 2040
    before = _metrics(server.url)
    body = json.dumps(gen_body(n=n, sp={"temperature": 1.0, "ignore_eos": True}, stream=stream)).encode()
    host, port = server.url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 30
    while _metrics(server.url)["slick_num_running_reqs"] < 1:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    sock.close()
    deadline = time.monotonic() + 20
    while (m := _metrics(server.url))["slick_num_running_reqs"] > 0:
        assert time.monotonic() < deadline, "the engine still decodes a request nobody waits for"
        time.sleep(0.02)
    assert m["slick_generation_tokens_total"] - before["slick_generation_tokens_total"] < n   # stopped early
    assert m["slick_disconnect_aborted_requests_total"] == before["slick_disconnect_aborted_requests_total"] + 1
    assert m["slick_http_inflight_requests"] == 0

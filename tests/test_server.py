"""`slick serve` as a real subprocess on 127.0.0.1: SGLang-native endpoints, errors, auth, SIGTERM."""
import asyncio
import json
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from slick.engines.router import launch_workers

pytestmark = pytest.mark.timeout(300)

KEY = "s3cret-key"
PROMPT = [1, 422, 2014, 314, 253, 1232, 30]


def call(url, path, body=None, *, method=None, headers=None, raw=None, timeout=60):
    """One HTTP request with this module's API key (harmless to a server without one); returns (status, parsed
    JSON or text)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def gen_body(ids=PROMPT, n=8, **kw):
    sp = {"max_new_tokens": n, "temperature": 0}
    sp.update(kw.pop("sp", {}))
    return {"input_ids": ids, "sampling_params": sp, "return_logprob": True, **kw}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", api_key=KEY, startup_timeout=240,   # weights: tmp dirs
                          extra_args=["--allowed-weight-dirs", str(tmp_path_factory.getbasetemp())])
    yield w
    w.stop()


def test_generate_single_shape_and_logprobs(server):
    st, out = call(server.url, "/generate", gen_body(n=6, sp={"temperature": 1.0, "sampling_seed": 3}))
    assert st == 200, out
    meta = out["meta_info"]
    assert set(meta) >= {"id", "finish_reason", "prompt_tokens", "completion_tokens", "weight_version",
                         "output_token_logprobs"}
    assert meta["prompt_tokens"] == len(PROMPT)
    assert meta["completion_tokens"] == len(out["output_ids"]) <= 6
    assert meta["finish_reason"]["type"] in ("stop", "length")
    lps = meta["output_token_logprobs"]
    assert len(lps) == len(out["output_ids"])
    for (lp, tok, none), t in zip(lps, out["output_ids"]):
        assert none is None and tok == t and lp <= 0.0
    assert isinstance(out["text"], str)
    # without return_logprob the field is absent
    st, out = call(server.url, "/generate", gen_body(n=2, return_logprob=False))
    assert st == 200 and "output_token_logprobs" not in out["meta_info"]


def test_generate_batch_and_text(server):
    prompts = [PROMPT, PROMPT[:3], [5, 6, 7, 8, 9]]
    st, out = call(server.url, "/generate", gen_body(prompts, n=4))
    assert st == 200 and isinstance(out, list) and len(out) == 3
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [7, 3, 5]
    assert len({o["meta_info"]["id"] for o in out}) == 3
    st, single = call(server.url, "/generate", gen_body(PROMPT[:3], n=4))
    assert single["output_ids"] == out[1]["output_ids"]          # greedy: batching does not change output
    st, out = call(server.url, "/generate", {"text": "Hello there", "sampling_params": {"max_new_tokens": 3},
                                             "router_added_field": {"x": 1}})   # unknown fields ignored
    assert st == 200 and out["meta_info"]["prompt_tokens"] > 0


def test_greedy_matches_in_process_local_engine(server, tiny_model_dir):
    from slick.engine.local import LocalEngine
    from slick.types import SamplingParams

    async def local():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", max_running=2)
        try:
            return await eng.generate(PROMPT, SamplingParams(temperature=0.0, max_new_tokens=12))
        finally:
            await eng.close()

    ref = asyncio.run(local())
    st, out = call(server.url, "/generate", gen_body(n=12))
    assert st == 200
    assert out["output_ids"] == ref.token_ids
    got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(ref.logprobs, abs=1e-4)
    assert out["meta_info"]["finish_reason"]["type"] == ref.finish_reason


BAD = [
    ("malformed json", b'{"input_ids": [1, 2', 400),
    ("body not an object", b'[1, 2, 3]', 400),
    ("no input", b'{"sampling_params": {}}', 400),
    ("input_ids not a list", b'{"input_ids": "1 2 3"}', 400),
    ("token id is a string", b'{"input_ids": [1, "2", 3]}', 400),
    ("token id is a float", b'{"input_ids": [1, 2.5]}', 400),
    ("empty input_ids", b'{"input_ids": []}', 400),
    ("empty prompt in batch", b'{"input_ids": [[1, 2], []]}', 400),
    ("token id beyond vocab", b'{"input_ids": [1, 49152]}', 400),
    ("negative token id", b'{"input_ids": [1, -3]}', 400),
    ("oversized prompt", json.dumps({"input_ids": [5] * 2048}).encode(), 413),
    ("max_new_tokens beyond context", b'{"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5000}}', 400),
    ("temperature wrong type", b'{"input_ids": [1], "sampling_params": {"temperature": "hot"}}', 400),
    ("negative temperature", b'{"input_ids": [1], "sampling_params": {"temperature": -1}}', 400),
    ("sampling_params not an object", b'{"input_ids": [1], "sampling_params": 7}', 400),
    ("return_logprob wrong type", b'{"input_ids": [1], "return_logprob": "yes"}', 400),
]


@pytest.mark.parametrize("name,raw,status", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_4xx_and_server_keeps_serving(server, name, raw, status):
    st, out = call(server.url, "/generate", raw=raw)
    assert st == status, (name, out)
    assert isinstance(out, dict) and isinstance(out.get("error"), str) and out["error"]
    st, out = call(server.url, "/generate", gen_body(n=2))
    assert st == 200 and len(out["output_ids"]) >= 1


def test_info_endpoints(server, tiny_model_dir):
    assert call(server.url, "/health")[0] == 200
    assert call(server.url, "/health_generate")[0] == 200
    st, info = call(server.url, "/get_model_info")
    assert st == 200 and info["model_path"] == str(tiny_model_dir) and info["is_generation"] is True
    st, info = call(server.url, "/get_server_info")
    assert st == 200 and info["dtype"] == "fp32" and "internal_states" in info
    st, v = call(server.url, "/get_weight_version")
    assert st == 200 and isinstance(v["weight_version"], int)
    assert call(server.url, "/no_such_endpoint")[0] == 404


def test_api_key_protects_every_endpoint_but_health(server):
    for path in ["/abort_request", "/pause_generation", "/continue_generation", "/flush_cache",
                 "/update_weights_from_disk", "/generate"]:
        assert call(server.url, path, {}, headers={"Authorization": ""})[0] == 401, path
        assert call(server.url, path, {}, headers={"Authorization": "Bearer wrong"})[0] == 401, path
    assert call(server.url, "/flush_cache", {}, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    assert call(server.url, "/abort_request", {}, headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    assert call(server.url, "/generate", gen_body(n=1))[0] == 200     # with the key (call() sends it)
    assert call(server.url, "/health", headers={"Authorization": ""})[0] == 200   # health stays open, as in SGLang


def _metrics(url):
    st, text = call(url, "/metrics")
    assert st == 200
    vals = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            vals[name] = float(value)
    return vals


def test_metrics_prometheus_text(server):
    before = _metrics(server.url)
    for key in ["slick_num_running_reqs", "slick_num_queue_reqs", "slick_generation_tokens_total",
                "slick_gen_throughput", "slick_weight_version", "slick_prefill_tokens_total",
                "slick_prefix_reused_tokens_total", "slick_prompt_reused_tokens_total"]:
        assert key in before
    st, out = call(server.url, "/generate", gen_body(n=5))
    after = _metrics(server.url)
    assert after["slick_generation_tokens_total"] - before["slick_generation_tokens_total"] == \
        out["meta_info"]["completion_tokens"]
    assert after["slick_requests_total"] == before["slick_requests_total"] + 1
    assert after["slick_prefill_tokens_total"] - before["slick_prefill_tokens_total"] == \
        out["meta_info"]["prompt_tokens"]


def test_metrics_count_the_openai_and_anthropic_routes(server):
    """/v1 requests, their errors and their tokens reach the counters (they stayed 0 while /generate counted)."""
    before = _metrics(server.url)
    st, chat = call(server.url, "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 5, "n": 2, "temperature": 1.0})
    st2, msg = call(server.url, "/v1/messages", {"model": "m", "max_tokens": 4,
                                                 "messages": [{"role": "user", "content": "hi"}]})
    st3, _ = call(server.url, "/v1/completions", {"model": "m", "prompt": "x", "max_tokens": -1})
    after = _metrics(server.url)
    assert (st, st2, st3) == (200, 200, 400), (chat, msg)
    assert after["slick_requests_total"] - before["slick_requests_total"] == 3
    assert after["slick_request_errors_total"] - before["slick_request_errors_total"] == 1
    assert after["slick_http_generation_tokens_total"] - before["slick_http_generation_tokens_total"] == \
        chat["usage"]["completion_tokens"] + msg["usage"]["output_tokens"]
    assert after["slick_prompt_tokens_total"] - before["slick_prompt_tokens_total"] == \
        chat["usage"]["prompt_tokens"] + msg["usage"]["input_tokens"]


def test_metrics_count_every_v1_route_streamed_or_not_and_disconnects(server):
    """Chat, completions, responses and messages, streamed and not, through the real clients, one refused request
    and one client that goes away: each is a request, the refused one an error, the one that went away a
    disconnect, and the tokens are the ones the answers report."""
    import socket

    import anthropic
    import openai

    before = _metrics(server.url)
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "hi"}]
    usages = [oa.chat.completions.create(model="m", messages=msgs, max_tokens=5, n=2, temperature=1.0).usage]
    chunks = list(oa.chat.completions.create(model="m", messages=msgs, max_tokens=5, stream=True,
                                             stream_options={"include_usage": True}))
    usages.append(chunks[-1].usage)
    chunks = list(oa.completions.create(model="m", prompt="x", max_tokens=4, stream=True,
                                        stream_options={"include_usage": True}))
    usages.append(chunks[-1].usage)
    usages.append(oa.responses.create(model="m", input="hi", max_output_tokens=4).usage)
    done = [e for e in oa.responses.create(model="m", input="hi", max_output_tokens=4, stream=True)
            if e.type == "response.completed"]
    usages.append(done[0].response.usage)
    a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    with a.messages.stream(model="m", max_tokens=4, messages=msgs) as st:
        usages.append(st.get_final_message().usage)
    st_, _ = call(server.url, "/v1/responses", {"model": "m", "input": "hi", "nonsense": 1})
    assert st_ == 400
    body = json.dumps({"model": "m", "messages": msgs, "max_tokens": 1900, "ignore_eos": True}).encode()
    host, port = server.url.rsplit("/", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    deadline = time.monotonic() + 30
    while _metrics(server.url)["slick_num_running_reqs"] < 1:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.02)
    sock.close()
    deadline = time.monotonic() + 20
    while (after := _metrics(server.url))["slick_num_running_reqs"] > 0:
        assert time.monotonic() < deadline, "the engine still decodes a request nobody waits for"
        time.sleep(0.02)
    d = {k: after[k] - before[k] for k in after if k.endswith("_total")}
    out = sum(getattr(u, "completion_tokens", None) or getattr(u, "output_tokens") for u in usages)
    inp = sum(getattr(u, "prompt_tokens", None) or getattr(u, "input_tokens") for u in usages)
    assert (d["slick_requests_total"], d["slick_request_errors_total"], d["slick_client_disconnects_total"],
            d["slick_disconnect_aborted_requests_total"]) == (8, 1, 1, 1), d
    assert d["slick_http_generation_tokens_total"] == out and 5 * 2 + 5 + 4 + 4 * 3 >= out > 0
    assert d["slick_prompt_tokens_total"] == inp
    assert d["slick_generation_tokens_total"] > out       # the engine also sampled for the one that went away


def test_update_weights_from_disk_changes_version(server, tiny_model_dir, tmp_path):
    from slick.models.tiny import make_tiny_model

    auth = {"Authorization": f"Bearer {KEY}"}
    other = make_tiny_model(tmp_path / "other", seed=123)
    _, before = call(server.url, "/generate", gen_body(n=8))
    st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(other), "weight_version": "7"},
                   headers=auth)
    assert st == 200 and out["success"] is True and out["weight_version"] == 7
    assert call(server.url, "/get_weight_version")[1]["weight_version"] == 7
    _, after = call(server.url, "/generate", gen_body(n=8))
    assert after["meta_info"]["weight_version"] == 7
    lp_b = [x[0] for x in before["meta_info"]["output_token_logprobs"]]
    lp_a = [x[0] for x in after["meta_info"]["output_token_logprobs"]]
    assert lp_a != pytest.approx(lp_b, abs=1e-3)                 # other weights, other distribution
    st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(tmp_path / "missing")},
                   headers=auth)
    assert st == 400 and out["success"] is False
    # restore: no version given -> increments
    st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(tiny_model_dir)}, headers=auth)
    assert st == 200 and out["weight_version"] == 8
    _, again = call(server.url, "/generate", gen_body(n=8))
    assert again["output_ids"] == before["output_ids"]


def _long_request(url, results, rid=None):
    body = gen_body(n=1500, sp={"temperature": 1.0, "sampling_seed": 1})
    if rid:
        body["rid"] = rid
    results.append(call(url, "/generate", body, timeout=120))


def _wait_running(url, limit_s=30):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if _metrics(url)["slick_http_inflight_requests"] >= 1:
            return
        time.sleep(0.05)
    raise AssertionError("request never started")


@pytest.mark.parametrize("by_rid", [False, True], ids=["all", "rid"])
def test_abort_request_returns_abort(server, by_rid):
    results = []
    t = threading.Thread(target=_long_request, args=(server.url, results, "req-abc" if by_rid else None))
    t.start()
    _wait_running(server.url)
    body = {"rid": "req-abc"} if by_rid else {}
    st, out = call(server.url, "/abort_request", body, headers={"Authorization": f"Bearer {KEY}"})
    t.join(60)
    assert st == 200 and out["success"] is True
    (st, res), = results
    assert st == 200 and res["meta_info"]["finish_reason"]["type"] == "abort"
    assert res["meta_info"]["completion_tokens"] < 1500


def test_pause_and_continue(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert call(server.url, "/pause_generation", {"mode": "in_place"}, headers=auth)[0] == 200
    results = []
    t = threading.Thread(target=lambda: results.append(call(server.url, "/generate", gen_body(n=2))))
    t.start()
    time.sleep(0.5)
    assert not results                                    # waits while paused
    assert call(server.url, "/continue_generation", {}, headers=auth)[0] == 200
    t.join(30)
    assert results and results[0][0] == 200


def test_sigterm_aborts_inflight_and_exits_zero(tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    try:
        results = []
        t = threading.Thread(target=_long_request, args=(w.url, results))
        t.start()
        _wait_running(w.url)
        w.proc.send_signal(signal.SIGTERM)
        code = w.proc.wait(timeout=60)
        t.join(30)
        assert code == 0, w.log_tail()
        (st, res), = results
        assert st == 200 and res["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        w.stop()


def test_stream_true_sends_the_tokens_so_far_then_the_final_sse_chunk(server):
    """Partial chunks (finish_reason null) carry the tokens, logprobs and versions generated since the previous
    one (output_offset: how many came before); together a prefix of the final chunk's (slick's fault tolerance
    keeps them when a worker dies)."""
    body = gen_body(n=200, sp={"temperature": 0.0, "ignore_eos": True})
    body.update(stream=True, return_logprob=True)
    req = urllib.request.Request(server.url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks = [ln[len("data: "):] for ln in r.read().decode().splitlines() if ln.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    out = json.loads(chunks[-2])
    assert out["meta_info"]["finish_reason"]["type"] == "length" and len(out["output_ids"]) == 200
    n = 0
    for c in map(json.loads, chunks[:-2]):
        k, meta, final = len(c["output_ids"]), c["meta_info"], out["meta_info"]
        assert meta["finish_reason"] is None and meta["output_offset"] == n and 0 < n + k < 200
        assert c["output_ids"] == out["output_ids"][n:n + k]
        assert meta["output_token_logprobs"] == final["output_token_logprobs"][n:n + k]
        assert meta["output_token_weight_versions"] == final["output_token_weight_versions"][n:n + k]
        n += k
    assert len(chunks) >= 3, "200 tokens were generated without one partial chunk (every 0.05 s)"


def test_slick_serve_is_detected_as_speaking_sglangs_api(server):
    from slick.engines.detect import server_kind
    assert server_kind(server.url) == "sglang"   # /get_model_info answers 401 without the key: the route exists

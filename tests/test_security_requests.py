"""Issue 50: no request can crash or monopolise `slick serve`. A real server subprocess on 127.0.0.1 with a tiny
random model; every hostile request is followed by a check that the same server still answers and generates.

- grammars that overflowed llguidance's stack (SIGSEGV, the whole server gone): a ``$defs`` chain 5,000 deep,
  a Lark grammar of 5,000 chained rules; now refused with a 400 naming the limit, or compiled safely;
- limits (``slick/engine/limits.py``), each a flag with a default: stop strings (count, length), n, grammar bytes
  and JSON-schema depth; 250,001 stop strings are refused in well under a second;
- ``/health`` answers within 0.5 s while hostile grammar requests are refused and constrained ones run;
- a streamed chat with n = 4, 8, 64 whose client disconnects: every choice is aborted and counted.
"""
import json
import socket
import threading
import time

import pytest

from slick.engines.router import launch_workers
from tests.test_security_http import post_json, request

pytestmark = pytest.mark.timeout(600)

PROMPT = [1, 422, 2014, 314, 253, 1232, 30]
HEALTH_BOUND_S = 0.5


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    yield w
    w.stop()


def _serves(url):
    """The server is alive: /health answers and a /generate produces its tokens."""
    st, _, _ = request(url, "GET", "/health", timeout=30)
    assert st == 200
    st, out, _ = post_json(url, "/generate", {"input_ids": PROMPT, "sampling_params": {
        "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}}, timeout=60)
    assert st == 200 and len(out["output_ids"]) == 3, out


def _chat(schema, **kw):
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}, **kw}


def defs_chain(n):
    """A schema whose ``$defs`` refer to each other n deep (d0 -> d1 -> ... -> dn)."""
    defs = {f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def rule_chain(n):
    return "\n".join(["start: r0"] + [f'r{i}: "x" r{i + 1} | "y"' for i in range(n)] + [f'r{n}: "z"'])


def nested(n):
    s = {"type": "integer"}
    for _ in range(n):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def _metrics(url):
    st, text, _ = request(url, "GET", "/metrics", timeout=30)
    assert st == 200
    return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln and not ln.startswith("#")}


# ------------------------------------------------------------------------------------------- 1. no crash
def test_defs_chain_5000_deep_is_refused_and_the_server_lives(server):
    body = _chat(defs_chain(5000))
    assert 300_000 < len(json.dumps(body)) < 4 << 20      # under the body limit, as in the issue
    st, out, dt = post_json(server.url, "/v1/chat/completions", body, timeout=120)
    assert st == 400, out
    assert "--max-grammar-bytes" in out["error"]["message"] and out["error"]["param"] == "response_format", out
    _serves(server.url)


def test_defs_chain_under_the_size_limit_compiles_safely(server):
    """1,500 levels fit in 128 KiB and crashed the compiler on an 8 MiB stack (SIGSEGV before the fix)."""
    schema = defs_chain(1500)
    assert len(json.dumps(schema)) < 128 * 1024
    st, out, _ = post_json(server.url, "/v1/chat/completions", _chat(schema), timeout=120)
    assert st == 200, out
    assert out["choices"][0]["message"]["content"].startswith("{"), out
    _serves(server.url)


def test_ebnf_of_5000_chained_rules_does_not_crash(server):
    grammar = rule_chain(5000)
    assert len(grammar.encode()) < 128 * 1024
    st, out, _ = post_json(server.url, "/generate", {"input_ids": PROMPT, "sampling_params": {
        "max_new_tokens": 6, "temperature": 0, "ebnf": grammar}}, timeout=120)
    assert st == 200, out
    text = out["text"]
    assert text and set(text) <= set("xyz") and set(text[:-1]) <= {"x"}, out     # x...x, then y or z (or cut)
    _serves(server.url)


def test_a_grammar_that_crashes_the_compiler_is_refused_by_name(server, tiny_model_dir):
    """Beyond any stack: 100,000 chained rules (2.4 MB) crash llguidance even with a 256 MiB stack. The helper
    process dies, the request is refused naming the signal, and the next grammar starts a new helper."""
    from slick.engine.grammar import GrammarError, llg_grammar
    from slick.engine.grammar_check import GrammarChecker
    from slick.engine.local import _eos_ids
    from pathlib import Path
    from slick.models.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    checker = GrammarChecker(tiny_model_dir, len(tok), _eos_ids(tok, Path(tiny_model_dir)), timeout_s=60)
    try:
        with pytest.raises(GrammarError, match=r"crashed on this grammar \(signal SIGSEGV"):
            checker.check(llg_grammar("ebnf", rule_chain(100_000)), "sampling.ebnf")
        assert checker.crashes == 1
        checker.check(llg_grammar("ebnf", rule_chain(10)), "sampling.ebnf")      # a new helper answers
        with pytest.raises(GrammarError, match="sampling.ebnf: .*nothere"):
            checker.check(llg_grammar("ebnf", "start: nothere"), "sampling.ebnf")
    finally:
        checker.close()
    assert checker._proc is None


# ------------------------------------------------------------------------------------------- 2. limits
def test_250001_stop_strings_are_refused_fast(server):
    stops = [f"s{i}" for i in range(250_001)]
    t0 = time.perf_counter()
    st, out, _ = post_json(server.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stop": stops}, timeout=60)
    dt = time.perf_counter() - t0
    assert st == 400 and out["error"]["param"] == "stop", out
    assert "250001 stop strings; the limit is 64 (--max-stop-strings)" in out["error"]["message"]
    assert dt < 3.0, f"refusing took {dt:.2f}s"
    st, out, _ = post_json(server.url, "/generate", {"input_ids": PROMPT, "sampling_params": {
        "max_new_tokens": 2, "stop": stops}}, timeout=60)
    assert st == 400 and "sampling_params.stop: 250001 stop strings" in out["error"], out
    _serves(server.url)


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/chat/completions", {"stop": ["x" * 513]}, "stop: a stop string of 513 characters; the limit is 512 "
                                                    "(--max-stop-chars)"),
    ("/generate", {"sampling_params": {"stop": ["y" * 600]}}, "sampling_params.stop: a stop string of 600 "
                                                               "characters; the limit is 512 (--max-stop-chars)"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": nested(60)}}}, "nested 121 levels deep; the limit is 64 (--max-grammar-depth)"),
    ("/generate", {"sampling_params": {"ebnf": "start: " + " | ".join(f'"{i}"' for i in range(30_000))}},
     "bytes; the limit is 131072 (--max-grammar-bytes)"),
    ("/generate", {"sampling_params": {"regex": "a" * 140_000}}, "(--max-grammar-bytes)"),
])
def test_each_limit_is_a_400_naming_its_flag(server, path, body, needle):
    if path == "/generate":
        body = {"input_ids": PROMPT, **body}
        body["sampling_params"]["max_new_tokens"] = 2
    else:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
    st, out, dt = post_json(server.url, path, body, timeout=60)
    msg = out["error"] if path == "/generate" else out["error"]["message"]
    assert st == 400 and needle in msg, out
    assert dt < 3.0


def test_limits_are_flags(tiny_model_dir):
    """Lower limits through the flags: 3 stop strings pass with --max-stop-strings 3, 4 do not; --max-n 2."""
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240, extra_args=[
        "--max-stop-strings", "3", "--max-n", "2", "--max-grammar-depth", "4", "--max-grammar-bytes", "2048",
        "--max-stop-chars", "5", "--grammar-timeout-s", "30"])
    try:
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        st, out, _ = post_json(w.url, "/v1/chat/completions", {**chat, "stop": ["a", "b", "c"], "n": 2})
        assert st == 200 and len(out["choices"]) == 2, out
        for extra, needle in [({"stop": ["a", "b", "c", "d"]}, "(--max-stop-strings)"),
                              ({"stop": ["abcdef"]}, "the limit is 5 (--max-stop-chars)"),
                              ({"n": 3}, "3 choices; the limit is 2 (--max-n)"),
                              (_chat(nested(2)), "nested 5 levels deep; the limit is 4 (--max-grammar-depth)"),
                              ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                                  "type": "object", "description": "d" * 3000}}}}, "(--max-grammar-bytes)")]:
            st, out, _ = post_json(w.url, "/v1/chat/completions", {**chat, **extra})
            assert st == 400 and needle in out["error"]["message"], (extra.keys(), out)
        st, info, _ = request(w.url, "GET", "/get_server_info")
        assert (info["max_stop"], info["max_n"], info["max_grammar_depth"]) == (3, 2, 4)
    finally:
        w.stop()
    from slick.serve.serve_cli import parse_args
    for bad in (["--max-n", "0"], ["--max-n", "129"], ["--grammar-timeout-s", "nan"], ["--max-stop-strings", "-1"]):
        with pytest.raises(SystemExit):
            parse_args(["--hf-checkpoint", str(tiny_model_dir), *bad])


# ------------------------------------------------------------------------------------------- 3. /health
def _poll_health(url, stop, lat):
    while not stop.is_set():
        st, _, dt = request(url, "GET", "/health", timeout=60)
        assert st == 200
        lat.append(dt)
        time.sleep(0.02)


def test_health_stays_fast_while_hostile_grammars_arrive(server):
    """The 60-deep schema is refused at once; a deep schema within the limits (30 objects, n = 8) and the
    5,000-rule grammar run meanwhile; /health never takes more than HEALTH_BOUND_S."""
    url = server.url
    stop, lat, results = threading.Event(), [], {}
    poller = threading.Thread(target=_poll_health, args=(url, stop, lat))
    poller.start()
    try:
        time.sleep(0.2)
        jobs = {
            "deep60": lambda: post_json(url, "/v1/chat/completions", _chat(nested(60), max_tokens=64), timeout=120),
            "deep30": lambda: post_json(url, "/v1/chat/completions", _chat(nested(30), max_tokens=64, n=8),
                                        timeout=300),
            "rules": lambda: post_json(url, "/generate", {"input_ids": PROMPT, "sampling_params": {
                "max_new_tokens": 32, "ebnf": rule_chain(4000) + "\n"}}, timeout=300),
        }
        threads = [threading.Thread(target=lambda k=k, f=f: results.__setitem__(k, f())) for k, f in jobs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        poller.join()
    assert results["deep60"][0] == 400 and "(--max-grammar-depth)" in results["deep60"][1]["error"]["message"]
    assert results["deep60"][2] < 2.0, results["deep60"][2]
    assert results["deep30"][0] == 200 and len(results["deep30"][1]["choices"]) == 8, results["deep30"][1]
    assert results["rules"][0] == 200, results["rules"][1]
    assert len(lat) >= 5 and max(lat) < HEALTH_BOUND_S, f"/health took up to {max(lat):.2f}s over {len(lat)} polls"
    _serves(url)


# ------------------------------------------------------------------------------------------- 4. disconnects
def _open_stream(url, body):
    """Send a streamed chat request on a raw socket and read until the first content chunk; return the socket."""
    host, port = url.split("://", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while got.count(b"data: ") < 2:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:200]
    return s


@pytest.mark.parametrize("n", [4, 8, 64])
def test_disconnected_stream_aborts_every_choice(server, n):
    url = server.url
    before = _metrics(url)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500, "n": n, "stream": True,
            "ignore_eos": True, "temperature": 1.0}
    s = _open_stream(url, body)
    time.sleep(0.3)
    assert _metrics(url)["slick_num_running_reqs"] == n
    s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = _metrics(url)
        if m["slick_num_running_reqs"] == 0 and m["slick_num_queue_reqs"] == 0:
            break
        time.sleep(0.1)
    assert m["slick_num_running_reqs"] == 0 and m["slick_num_queue_reqs"] == 0, m
    t0 = m["slick_generation_tokens_total"]
    time.sleep(0.5)
    after = _metrics(url)
    assert after["slick_generation_tokens_total"] == t0               # nothing generates any more
    assert after["slick_generation_tokens_total"] - before["slick_generation_tokens_total"] < n * 1500
    assert after["slick_aborted_requests_total"] - before["slick_aborted_requests_total"] == n
    assert after["slick_disconnect_aborted_requests_total"] - before["slick_disconnect_aborted_requests_total"] == n
    _serves(url)

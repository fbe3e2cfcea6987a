"""Issue 30 (findings 3, 4, 8): no web page can drive slick's HTTP servers, every body is size-checked before it is
parsed, and answers are always valid JSON. Real `slick serve` / `slick inspect` subprocesses on 127.0.0.1 with a
tiny random model; raw HTTP (http.client) so that Host, Origin and Content-Type are exactly what a browser or an
attacker would send."""
import asyncio
import http.client
import json
import os
import stat
import threading
import time

import psutil
import pytest

from slick.engines.router import launch_workers

pytestmark = pytest.mark.timeout(300)

KEY = "sec-key"
PROMPT = [1, 422, 2014, 314, 253, 1232, 30]


def request(url, method, path, body=None, headers=None, timeout=60):
    """One raw HTTP request; ``body`` bytes are sent as they are. Returns (status, parsed JSON or text, seconds)."""
    hostport = url.split("://", 1)[1]
    conn = http.client.HTTPConnection(hostport, timeout=timeout)
    h = {"Host": hostport}
    h.update(headers or {})
    t0 = time.perf_counter()
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in h.items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        if body is not None:
            try:
                conn.send(body)
            except (BrokenPipeError, ConnectionResetError):
                pass          # the server answered (413) before taking the whole body
        resp = conn.getresponse()
        status, text = resp.status, resp.read().decode()
    finally:
        conn.close()
    dt = time.perf_counter() - t0
    try:
        return status, strict_json(text), dt
    except ValueError:
        return status, text, dt


def strict_json(text):
    """json.loads refusing NaN/Infinity (what any non-Python JSON parser does)."""
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=no_constant)


def post_json(url, path, obj, headers=None, **kw):
    return request(url, "POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})},
                   **kw)


def gen_body(ids=PROMPT, n=4, **sp):
    return {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, **sp},
            "return_logprob": True}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def keyed(tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", api_key=KEY, startup_timeout=240)
    yield w
    w.stop()


def _generates(url):
    st, out, _ = post_json(url, "/generate", gen_body(n=3), timeout=60)
    assert st == 200, out
    assert len(out["output_ids"]) == 3
    return out


# ---------------------------------------------------------------------------------------------- finding 3
def test_text_plain_pause_is_refused_and_generate_still_works(server):
    url = server.url
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        st, out, _ = request(url, "POST", "/pause_generation", b'{"mode": "abort"}',
                             {"Content-Type": ctype} if ctype else {})
        assert st == 415, (ctype, out)
        assert "Content-Type: application/json" in out["error"]
    st, out, _ = request(url, "POST", "/update_weights_from_disk", b'{"model_path": "/tmp"}',
                         {"Content-Type": "text/plain"})
    assert st == 415
    st, info, _ = request(url, "GET", "/get_server_info")
    assert st == 200 and info["paused"] is False
    _generates(url)                                       # not paused: /generate answers
    st, out, _ = request(url, "POST", "/continue_generation", b"", {"Content-Type": "application/json"})
    assert st == 200 and out["success"] is True           # JSON control call with an empty body still works


def test_foreign_origin_is_refused_on_every_route(server):
    url = server.url
    evil = {"Origin": "http://evil.example"}
    st, out, _ = post_json(url, "/pause_generation", {"mode": "abort"}, evil)
    assert st == 403 and "evil.example" in out["error"]
    assert post_json(url, "/generate", gen_body(), evil)[0] == 403
    assert request(url, "GET", "/get_server_info", headers=evil)[0] == 403
    st, out, _ = post_json(url, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, evil)
    assert st == 403 and "evil.example" in out["error"]["message"]          # OpenAI's error shape on /v1
    assert post_json(url, "/generate", gen_body(), {"Origin": "null"})[0] == 403
    # same host, another port (another local web page) is another origin
    other_port = {"Origin": "http://127.0.0.1:1"}
    assert post_json(url, "/generate", gen_body(), other_port)[0] == 403
    # a browser's cross-site subresource GET carries no Origin, only Sec-Fetch-Site
    assert request(url, "GET", "/flush_cache", headers={"Sec-Fetch-Site": "cross-site"})[0] == 403
    # this server's own origin passes
    st, _, _ = post_json(url, "/generate", gen_body(), {"Origin": url})
    assert st == 200
    assert request(url, "GET", "/get_server_info")[1]["paused"] is False


def test_foreign_host_is_refused_by_serve(server):
    url = server.url
    port = url.rsplit(":", 1)[1]
    for host in ("attacker.example", f"attacker.example:{port}", f"localhost.attacker.example:{port}"):
        st, out, _ = request(url, "GET", "/get_model_info", headers={"Host": host})
        assert st == 403, host
        assert "attacker.example" in out["error"] and "--allowed-hosts" in out["error"]
    assert post_json(url, "/generate", gen_body(), {"Host": f"attacker.example:{port}"})[0] == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert request(url, "GET", "/get_model_info", headers={"Host": host})[0] == 200, host


def test_allowed_hosts_flag(tiny_model_dir):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240,
                          extra_args=["--allowed-hosts", "trainer.internal, [fd00::5]"])
    try:
        port = w.url.rsplit(":", 1)[1]
        assert request(w.url, "GET", "/get_model_info", headers={"Host": f"trainer.internal:{port}"})[0] == 200
        assert request(w.url, "GET", "/get_model_info", headers={"Host": f"[fd00::5]:{port}"})[0] == 200
        assert request(w.url, "GET", "/get_model_info", headers={"Host": f"other.internal:{port}"})[0] == 403
        # an allowed host's pages may call it (any port)
        st, _, _ = post_json(w.url, "/generate", gen_body(n=1), {"Origin": "http://trainer.internal:8080"})
        assert st == 200
    finally:
        w.stop()


def test_foreign_host_is_refused_by_inspect(tmp_path):
    from tests.rollout_data import make_run
    from tests.test_inspect import inspector

    make_run(tmp_path)
    with inspector(tmp_path) as url:
        port = url.rsplit(":", 1)[1]
        st, out, _ = request(url, "GET", "/api/samples?step=1", headers={"Host": f"attacker.example:{port}"})
        assert st == 403 and "attacker.example" in out["error"]
        assert request(url, "GET", "/", headers={"Host": "attacker.example"})[0] == 403
        assert request(url, "GET", "/api/run", headers={"Origin": "http://evil.example"})[0] == 403
        st, run, _ = request(url, "GET", "/api/run", headers={"Host": f"localhost:{port}"})
        assert st == 200 and isinstance(run, dict)
        st, _, _ = request(url, "GET", "/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"})
        assert st == 200                                  # following a link to the page is fine


def test_update_weights_only_from_allowed_dirs(server, tiny_model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    from slick.models.tiny import make_tiny_model
    from slick.weights.transport.disk import write_weights_dir

    url = server.url
    v0 = request(url, "GET", "/get_weight_version")[1]["weight_version"]
    zeroed = make_tiny_model(tmp_path / "zeroed", seed=1)
    st, out, _ = post_json(url, "/update_weights_from_disk", {"model_path": str(zeroed), "weight_version": 999})
    assert st == 403, out
    assert str(zeroed) in out["error"] and "--allowed-weight-dirs" in out["error"]
    st, out, _ = post_json(url, "/update_weights_from_disk", {"model_path": "/etc", "weight_version": 999})
    assert st == 403
    assert request(url, "GET", "/get_weight_version")[1]["weight_version"] == v0
    # a symlink into an allowed place does not launder a foreign target, nor the other way round
    link = tmp_path / "link-to-zeroed"
    link.symlink_to(zeroed)
    assert post_json(url, "/update_weights_from_disk", {"model_path": str(link)})[0] == 403
    # what slick's disk transport writes is loadable
    tensors = {}
    for f in sorted(os.listdir(tiny_model_dir)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(tiny_model_dir, f)))
    synced = write_weights_dir(tmp_path / "weights", v0 + 5, sorted(tensors.items()), bucket_bytes=1 << 30)
    st, out, _ = post_json(url, "/update_weights_from_disk", {"model_path": str(synced), "weight_version": v0 + 5})
    assert st == 200 and out["weight_version"] == v0 + 5, out
    # ... unless another user could have written it
    os.chmod(synced, os.stat(synced).st_mode | stat.S_IWOTH)
    try:
        assert post_json(url, "/update_weights_from_disk", {"model_path": str(synced)})[0] == 403
    finally:
        os.chmod(synced, os.stat(synced).st_mode & ~stat.S_IWOTH)
    # the served checkpoint may always be reloaded
    st, out, _ = post_json(url, "/update_weights_from_disk", {"model_path": str(tiny_model_dir), "weight_version": v0})
    assert st == 200 and out["weight_version"] == v0
    assert torch.is_tensor(next(iter(tensors.values())))
    _generates(url)


def test_allowed_weight_dirs_flag(tiny_model_dir, tmp_path):
    from slick.models.tiny import make_tiny_model

    other = make_tiny_model(tmp_path / "ckpts" / "other", seed=3)
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240,
                          extra_args=["--allowed-weight-dirs", str(tmp_path / "ckpts")])
    try:
        st, out, _ = post_json(w.url, "/update_weights_from_disk", {"model_path": str(other), "weight_version": 4})
        assert st == 200 and out["weight_version"] == 4, out
        outside = make_tiny_model(tmp_path / "elsewhere", seed=4)
        assert post_json(w.url, "/update_weights_from_disk", {"model_path": str(outside)})[0] == 403
    finally:
        w.stop()


def test_slick_client_sends_json_to_control_endpoints(server):
    from slick.engines.client import HttpEngine

    async def go():
        eng = HttpEngine([server.url])
        try:
            await eng.pause_generation()
            await eng.continue_generation()
            out = await eng.control(server.url, "/flush_cache")      # no payload: still JSON
            assert out["success"] is True
        finally:
            await eng.close()

    asyncio.run(go())
    _generates(server.url)


# ---------------------------------------------------------------------------------------------- finding 4
def test_api_key_covers_every_route_but_health(keyed):
    url = keyed.url
    auth = {"Authorization": f"Bearer {KEY}"}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    st, out, _ = post_json(url, "/v1/chat/completions", chat)
    assert st == 401 and "API key" in out["error"]["message"]
    assert post_json(url, "/v1/chat/completions", chat, {"Authorization": "Bearer wrong"})[0] == 401
    assert request(url, "GET", "/v1/models")[0] == 401
    assert post_json(url, "/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 401
    assert post_json(url, "/generate", gen_body())[0] == 401
    assert request(url, "GET", "/get_server_info")[0] == 401
    for path in ("/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group"):
        assert post_json(url, path, {})[0] == 401, path
    for path in ("/health", "/health_generate", "/metrics"):     # open, as in SGLang
        assert request(url, "GET", path)[0] == 200, path
    st, out, _ = post_json(url, "/v1/chat/completions", chat, auth)
    assert st == 200 and out["object"] == "chat.completion"
    st, out, _ = request(url, "GET", "/v1/models", headers=auth)
    assert st == 200 and out["data"][0]["object"] == "model"
    assert post_json(url, "/generate", gen_body(), auth)[0] == 200


def _rss(pid):
    return psutil.Process(pid).memory_info().rss


def test_oversized_bodies_are_refused_fast_with_bounded_memory(server):
    """21 MB of chat content (4 GB peak before) and 57 MiB of input_ids: 413 in well under a second, and the
    server's RSS grows by less than 32 MiB over all of them."""
    url = server.url
    before = _rss(server.pid)
    chat = json.dumps({"messages": [{"role": "user", "content": "x" * (21 * 10**6)}]}).encode()
    ids = json.dumps({"input_ids": [5] * (57 * 2**20 // 3)}).encode()
    for path, body in (("/v1/chat/completions", chat), ("/generate", ids), ("/v1/completions", ids)):
        st, out, dt = request(url, "POST", path, body, {"Content-Type": "application/json"})
        assert st == 413, (path, out)
        assert "--max-request-bytes" in json.dumps(out)
        assert dt < 2.0, (path, dt)
    # a chunked body (no Content-Length) is cut off at the same limit
    hostport = url.split("://", 1)[1]
    conn = http.client.HTTPConnection(hostport, timeout=60)
    try:
        chunks = (b'{"input_ids": [' if i == 0 else b"5, " * 2**18 for i in range(40))       # ~30 MiB
        conn.request("POST", "/generate", body=chunks, encode_chunked=True,
                     headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        st, out = resp.status, json.loads(resp.read())
    except (BrokenPipeError, ConnectionResetError):
        st, out = "reset", {"error": "connection closed while sending"}
    finally:
        conn.close()
    assert st == 413 and "--max-request-bytes" in out["error"], out
    # under the byte limit, over what any prompt that fits the context can hold: refused before rendering
    st, out, dt = post_json(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "y" * 3_000_000}]})
    assert st == 413 and out["error"]["param"] == "messages", out
    st, out, dt = post_json(url, "/generate", {"text": "z" * 3_000_000})
    assert st == 413 and "text" in out["error"]
    grown = _rss(server.pid) - before
    assert grown < 32 * 2**20, f"RSS grew by {grown / 2**20:.0f} MiB"
    _generates(url)


def _health_poller(url, stop, worst):
    while not stop.is_set():
        st, _, dt = request(url, "GET", "/health", timeout=30)
        assert st == 200
        worst.append(dt)
        time.sleep(0.01)


def test_big_input_ids_are_refused_while_health_stays_responsive(server):
    """A body just under the 4 MiB limit (about 1.4M token ids over 680 prompts, the last id out of the
    vocabulary) is checked off the event loop: four at once, and /health answers throughout, each time within 0.5 s
    or 40% of the time the four take, whichever is longer (checked on the loop, /health would wait for all four:
    about 100% of it; the relative bound keeps a loaded 2-core machine, whose parsing threads still share the GIL
    with the loop, from failing it)."""
    url = server.url
    prompts = [[5] * 2047 for _ in range(680)]
    prompts[-1][-1] = 10**6
    body = json.dumps({"input_ids": prompts, "sampling_params": {"max_new_tokens": 1}}).encode()
    assert 3 * 2**20 < len(body) < 4 * 2**20
    stop, worst = threading.Event(), []
    poller = threading.Thread(target=_health_poller, args=(url, stop, worst))
    poller.start()
    results = []
    try:
        time.sleep(0.1)
        senders = [threading.Thread(target=lambda: results.append(
            request(url, "POST", "/generate", body, {"Content-Type": "application/json"}, timeout=120)))
            for _ in range(4)]
        huge = threading.Thread(target=lambda: results.append(request(
            url, "POST", "/generate", b'{"input_ids": [' + b"7, " * (20 * 2**20) + b"7]}",
            {"Content-Type": "application/json"}, timeout=120)))
        t0 = time.monotonic()
        for t in senders + [huge]:
            t.start()
        for t in senders + [huge]:
            t.join()
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        poller.join()
    statuses = sorted(r[0] for r in results)
    assert statuses == [400, 400, 400, 400, 413], [(r[0], str(r[1])[:200]) for r in results]
    msg = [r[1]["error"] for r in results if r[0] == 400][0]
    assert "input_ids[679][2046]" in msg and "vocabulary" in msg
    assert len(worst) >= 3 and max(worst) < max(0.5, 0.4 * elapsed), \
        f"/health took up to {max(worst):.2f}s while the four took {elapsed:.2f}s"


# ---------------------------------------------------------------------------------------------- finding 8
def test_lone_surrogate_is_400_naming_the_field(server):
    url = server.url
    cases = [
        ("/generate", b'{"text": "ab\\ud800", "sampling_params": {"max_new_tokens": 1}}', "text"),
        ("/generate", b'{"input_ids": [1, 2], "rid": "\\udc00"}', "rid"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}, {"role": "user", '
                                 b'"content": "x\\ud800y"}], "max_tokens": 1}', "messages[1].content"),
        ("/v1/completions", b'{"prompt": "\\udfff", "max_tokens": 1}', "prompt"),
    ]
    for path, raw, field in cases:
        st, out, _ = request(url, "POST", path, raw, {"Content-Type": "application/json"})
        assert st == 400, (path, out)
        msg = out["error"] if isinstance(out["error"], str) else out["error"]["message"]
        assert msg.startswith(f"{field} contains a lone UTF-16 surrogate"), (path, msg)
    # a proper pair (an emoji) is fine
    st, out, _ = request(url, "POST", "/generate", b'{"text": "ok \\ud83d\\ude00", "sampling_params": '
                                                   b'{"max_new_tokens": 1}}', {"Content-Type": "application/json"})
    assert st == 200, out


def test_unrepresentable_numbers_are_refused(server):
    url = server.url
    for raw in (b'{"input_ids": [1], "sampling_params": {"temperature": 1e400}}',
                b'{"input_ids": [1], "sampling_params": {"temperature": NaN}}',
                b'{"input_ids": [1], "sampling_params": {"top_p": -Infinity}}'):
        st, out, _ = request(url, "POST", "/generate", raw, {"Content-Type": "application/json"})
        assert st == 400 and "unrepresentable number" in out["error"], (raw, out)
    st, out, _ = request(url, "POST", "/v1/completions", b'{"prompt": "a", "temperature": Infinity}',
                         {"Content-Type": "application/json"})
    assert st == 400 and "unrepresentable number" in out["error"]["message"]


def test_tiny_temperature_answers_valid_json(server):
    """temperature 1e-45 used to answer -Infinity logprobs (not JSON); every answer now parses strictly."""
    url = server.url
    st, out, _ = post_json(url, "/generate", gen_body(n=4, temperature=1e-45, sampling_seed=1))
    assert st in (200, 400), out          # valid JSON either way (request() parsed it strictly)
    assert isinstance(out, dict)
    if st == 200:
        assert all(isinstance(x[0], float) for x in out["meta_info"]["output_token_logprobs"])
    st, out, _ = post_json(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 4, "temperature": 1e-45, "logprobs": True})
    assert st in (200, 400) and isinstance(out, dict), out


def test_json_encoding_boundary_never_writes_non_finite():
    from slick.serve.http_body import dumps

    text = dumps({"lp": [float("-inf"), -0.5], "x": float("nan"), "y": float("inf"), "t": (1.0,)})
    assert strict_json(text) == {"lp": [-9999.0, -0.5], "x": None, "y": 9999.0, "t": [1.0]}
    assert dumps({"a": 1.5}) == '{"a": 1.5}'


def test_new_serve_flags_are_parsed_and_checked(tiny_model_dir, capsys):
    from slick.serve.serve_cli import parse_args

    base = ["--hf-checkpoint", str(tiny_model_dir)]
    args = parse_args(base + ["--allowed-hosts", "Box.Example, [::1]", "--allowed-weight-dirs", "/x, /y/z",
                              "--max-request-bytes", "2048"])
    assert args.allowed_hosts == ["box.example", "::1"]
    assert args.allowed_weight_dirs == ["/x", "/y/z"] and args.max_request_bytes == 2048
    with pytest.raises(SystemExit):
        parse_args(base + ["--allowed-hosts", "box.example:8080"])
    assert "--allowed-hosts: 'box.example:8080' is not a host name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(base + ["--max-request-bytes", "10"])
    assert "--max-request-bytes 10: must be at least 1024" in capsys.readouterr().err

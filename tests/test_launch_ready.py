"""A launched server is ready only as the process slick started (slick/engines/launch_ready.py): a real squatter
answering 200 on /health at the port is refused by pid, a server that exits at start-up is reported with its exit
code and the last lines of its log, and a server whose listening socket belongs to a child of the launched process
(as vLLM's and the router's do) is ready."""
import asyncio
import http.server
import os
import signal
import sys
import threading
import time

import pytest

from slick.engines.launch_ready import ServerStartError, log_tail, port_owner
from slick.engines.router import WorkerProcess, _log_path, free_port, launch_workers

pytestmark = pytest.mark.timeout(120)


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *a):
        pass


@pytest.fixture
def squatter():
    """A real HTTP server in this process on a free loopback port, answering 200 to every GET."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_a_squatter_answering_health_is_not_the_launched_server(tiny_model_dir, squatter, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as e:
        launch_workers(tiny_model_dir, 1, dtype="fp32", base_port=squatter, startup_timeout=60, log_dir=str(tmp_path))
    msg = str(e.value)
    assert f"port {squatter}" in msg and f"pid {os.getpid()} (" in msg, msg
    assert time.monotonic() - t0 < 30        # refused at once, not after the start-up timeout
    assert port_owner(squatter, os.getpid())[0] == "ours"   # the squatter (this process) still holds it


SERVER = r"""
import http.server, os, sys, time
port, mode = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
print("loading the model", flush=True)
if mode == "crash":
    time.sleep(0.5)
    print("RuntimeError: no CPU kernel for this model's attention", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "late":             # healthy, then its engine fails and the process exits
    import threading
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    time.sleep(2.0)
    print("EngineCore failed: RuntimeError: no CPU kernel for this model's attention", flush=True)
    os._exit(1)
if mode == "alive500":         # healthy and alive, but every request fails (as vLLM on a model its kernels lack)
    class H500(H):
        def do_POST(self):
            print("ERROR EngineCore: RuntimeError: no CPU kernel for this model's attention", flush=True)
            self.send_response(500); self.send_header("Content-Length", "21"); self.end_headers()
            self.wfile.write(b"Internal Server Error")
    time.sleep(0.5)
    http.server.HTTPServer(("127.0.0.1", port), H500).serve_forever()
if mode == "child":            # the listening socket belongs to a child, as with vLLM's API server
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        sys.exit(0)
time.sleep(0.5)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake(tmp_path, mode: str) -> WorkerProcess:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    port = free_port()
    return WorkerProcess([sys.executable, str(script), str(port), mode], f"http://127.0.0.1:{port}",
                         _log_path("fake-", str(tmp_path)))


def test_a_server_that_exits_at_start_up_is_reported_with_its_log(tmp_path):
    w = _fake(tmp_path, "crash")
    with pytest.raises(ServerStartError) as e:
        w.wait_ready(30)
    msg = str(e.value)
    assert f"slick serve worker (pid {w.pid}) exited with code 3 before it was ready" in msg
    assert msg.endswith("loading the model\nRuntimeError: no CPU kernel for this model's attention"), msg


def test_a_server_listening_from_a_child_process_is_ready(tmp_path):
    w = _fake(tmp_path, "child")
    try:
        w.wait_ready(30)
        owner, _ = port_owner(int(w.url.rsplit(":", 1)[1]), w.pid)
        assert owner == "ours" and port_owner(int(w.url.rsplit(":", 1)[1]), os.getpid())[0] == "ours"
    finally:
        w.stop(timeout=5)
        os.killpg(w.pid, signal.SIGKILL)     # the child serving the port is in the launched process's session
    assert log_tail(w.log_path) == "loading the model"


def test_a_launched_server_that_dies_after_ready_ends_the_run_quoting_its_log(tmp_path):
    from slick.config import Config
    from slick.engines.client import HttpEngine
    from slick.engines.fault import EngineDied
    from slick.factory.engines import EngineSet

    w = _fake(tmp_path, "late")
    w.wait_ready(30)
    engines = EngineSet(HttpEngine([w.url]), "disk", [w], [w.url])

    async def go():
        engines.watch(Config.from_flat({}), pending=lambda: [3, 4])
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return engines.failure
        finally:
            await engines.close()
    err = asyncio.run(go())
    assert isinstance(err, EngineDied), err
    msg = str(err)
    assert msg.startswith(f"engine worker {w.url} (pid {w.pid}) failed: its process exited") and "[3, 4]" in msg
    assert msg.endswith(f"last lines of {w.log_path}:\nloading the model\n"
                        f"EngineCore failed: RuntimeError: no CPU kernel for this model's attention"), msg


@pytest.mark.parametrize("ft", [False, True])
def test_a_launched_server_answering_500_ends_the_run_quoting_its_log(tmp_path, ft):
    """A launched server stays alive and healthy but answers every request with a bare 500: the run's error
    quotes the last lines of its log (the cause), not only the 500 (--use-fault-tolerance's streamed path too)."""
    from slick.engines.client import EngineError, HttpEngine
    from slick.factory.engines import server_logs
    from slick.types import SamplingParams

    w = _fake(tmp_path, "alive500")
    try:
        w.wait_ready(30)
        eng = HttpEngine([w.url], server_logs=server_logs([w]), max_retries=1, timeout=3 if ft else 30)
        eng.fault_tolerant = ft

        async def go():
            try:
                return await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=4))
            finally:
                await eng.close()
        with pytest.raises(EngineError) as e:
            asyncio.run(go())
    finally:
        w.stop(timeout=5)
    msg = str(e.value)
    assert "HTTP 500" in msg, msg
    assert f"last lines of {w.log_path}:\nloading the model\nERROR EngineCore: RuntimeError: no CPU kernel" in msg, msg
    assert HttpEngine([w.url]).logs_of([w.url]) == ""          # a server slick did not launch: no log to quote

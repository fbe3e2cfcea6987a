"""Hostile programs (issue 36): each is contained, gets its verdict, and leaves the host as it was: no
process left (psutil), no program directory left, free memory and disk back within a stated bound, and the
pool still runs an honest program right after."""
from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from slick.reward import sandbox as sb
from tests.sandbox_tools import HostState, make_pool

LIMITS = dict(wall_seconds=4.0, cpu_seconds=1, memory_mb=512, max_processes=16, file_size_mb=4, output_kb=256,
              tmp_mb=16)


@pytest.fixture(scope="module")
def pool():
    return make_pool(2, **LIMITS)


def contained(pool, code: str, stdin: str = "") -> sb.Result:
    """Run ``code``, check the host is back where it was and the pool still works; the hostile result."""
    before = HostState()
    result = pool.run(code, stdin)
    before.assert_back()
    honest = pool.run("print(sum(map(int, input().split())))", "2 3\n")
    assert (honest.verdict, honest.stdout) == ("ok", "5\n")
    return result


def test_fork_bomb(pool):
    r = contained(pool, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert r.verdict == sb.TIME_LIMIT
    assert r.seconds < LIMITS["wall_seconds"] + 3


def test_fork_bomb_hits_the_process_limit(pool):
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n")
    r = contained(pool, code)
    assert r.verdict == sb.OK
    forked, errno = map(int, r.stdout.split())
    assert errno == 11 and forked < LIMITS["max_processes"]      # EAGAIN at RLIMIT_NPROC


def test_busy_loop(pool):
    r = contained(pool, "while True: pass\n")
    assert r.verdict == sb.TIME_LIMIT and r.exit_code == 128 + 24      # SIGXCPU at the CPU limit
    assert r.seconds < LIMITS["wall_seconds"]


def test_allocating_50_gb(pool):
    r = contained(pool, "x = bytearray(50 * 2**30)\n")
    assert r.verdict == sb.MEMORY_LIMIT and "MemoryError" in r.stderr_tail


def test_allocating_step_by_step(pool):
    r = contained(pool, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n")
    assert r.verdict == sb.MEMORY_LIMIT


def test_10_gb_to_stdout(pool):
    r = contained(pool, "import sys\nb = 'x' * (1 << 20)\nfor _ in range(10240):\n    sys.stdout.write(b)\n")
    assert r.verdict == sb.OUTPUT_LIMIT
    assert len(r.stdout) == LIMITS["output_kb"] * 1024


def test_10_gb_to_a_file(pool):
    r = contained(pool, "b = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    for _ in range(10240):\n"
                        "        f.write(b)\n")
    assert r.verdict == sb.OUTPUT_LIMIT and "File too large" in r.stderr_tail


def test_many_files_fill_tmp_not_the_disk(pool):
    code = ("b = b'x' * (1 << 20)\ni = 0\nwhile True:\n    with open(f'f{i}', 'wb') as f:\n"
            "        for _ in range(3):\n            f.write(b)\n    i += 1\n")
    r = contained(pool, code)
    assert r.verdict == sb.OUTPUT_LIMIT and "No space left on device" in r.stderr_tail


def test_reading_secrets(pool, tmp_path):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    run_dir.mkdir()
    ckpt.mkdir()
    (run_dir / "metrics.jsonl").write_text("secret run data\n")
    (ckpt / "model.safetensors").write_text("secret weights\n")
    paths = [os.path.expanduser("~/.ssh/id_rsa"), os.path.expanduser("~/.ssh"), "/etc/shadow", "/etc/passwd",
             str(run_dir / "metrics.jsonl"), str(ckpt / "model.safetensors"), os.getcwd() + "/pyproject.toml"]
    code = (f"import json, os\nout = {{}}\nfor p in {paths!r}:\n    try:\n"
            "        out[p] = open(p).read(20) if not os.path.isdir(p) else os.listdir(p)\n"
            "    except OSError as e:\n        out[p] = type(e).__name__\nprint(json.dumps(out))\n")
    r = contained(pool, code)
    assert r.verdict == sb.OK
    seen = json.loads(r.stdout)
    assert seen == {p: "FileNotFoundError" for p in paths}


def test_deleting_files_outside_its_tmp(pool, tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("keep me")
    code = (f"import json, os\nout = {{}}\nfor op, p in [('remove', {str(canary)!r}), ('remove', '/sandbox/main.py'),"
            " ('create', '/usr/slick-canary'), ('create', '/sandbox/x'), ('remove', '/usr/bin/python3')]:\n"
            "    try:\n        os.remove(p) if op == 'remove' else open(p, 'w').close()\n        out[p] = 'done'\n"
            "    except OSError as e:\n        out[p] = e.strerror\n"
            "open('/tmp/mine', 'w').write('ok')\nos.remove('/tmp/mine')\nprint(json.dumps(out))\n")
    r = contained(pool, code)
    assert r.verdict == sb.OK
    assert json.loads(r.stdout) == {str(canary): "No such file or directory",
                                    "/sandbox/main.py": "Read-only file system",
                                    "/usr/slick-canary": "Read-only file system",
                                    "/sandbox/x": "Read-only file system",
                                    "/usr/bin/python3": "Read-only file system"}
    assert canary.read_text() == "keep me" and os.path.exists("/usr/bin/python3")
    assert not os.path.exists("/usr/slick-canary")


class _Counting(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self):
        type(self).hits += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_sockets_reach_nothing(pool):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        code = (f"import json, socket\nout = {{}}\nfor host, port in [('127.0.0.1', {port}), ('1.1.1.1', 53), "
                "('8.8.8.8', 443)]:\n    s = socket.socket()\n    s.settimeout(2)\n    try:\n"
                "        s.connect((host, port))\n        out[host] = 'connected'\n    except OSError as e:\n"
                "        out[host] = e.errno\nprint(json.dumps(out))\n")
        r = contained(pool, code)
        assert r.verdict == sb.OK
        assert json.loads(r.stdout) == {"127.0.0.1": 111, "1.1.1.1": 101, "8.8.8.8": 101}   # refused, unreachable
        assert _Counting.hits == 0
    finally:
        server.shutdown()
        server.server_close()


def test_background_process_does_not_outlive_the_program(pool):
    code = ("import os, subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        import time; time.sleep(60)\n"
            "    os._exit(0)\nprint('left')\n")
    r = contained(pool, code)          # HostState: no process of the sandbox remains
    assert (r.verdict, r.stdout) == (sb.OK, "left\n")


def test_killing_its_parent_and_the_host(pool):
    code = (f"import json, os, signal\nout = {{}}\nfor pid in (os.getppid(), 1, {os.getpid()}):\n    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n        out[pid] = 'sent'\n    except OSError as e:\n"
            "        out[pid] = e.errno\nprint(json.dumps(out))\n")
    r = contained(pool, code)
    assert r.verdict == sb.OK
    out = json.loads(r.stdout)
    assert out[str(os.getpid())] == 3             # ESRCH: the host's processes are not in its PID namespace
    # its parent is the sandbox's init: the kernel ignores SIGKILL sent to it from inside


def test_sleeping_past_the_timeout(pool):
    r = contained(pool, "import time\nprint('start', flush=True)\ntime.sleep(100)\n")
    assert r.verdict == sb.TIME_LIMIT and r.stdout == "start\n"
    assert LIMITS["wall_seconds"] <= r.seconds < LIMITS["wall_seconds"] + 3


def test_ctypes_cannot_raise_its_limits(pool):
    code = ("import ctypes, resource\nclass R(ctypes.Structure):\n"
            "    _fields_ = [('cur', ctypes.c_ulong), ('max', ctypes.c_ulong)]\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "rc = libc.setrlimit(resource.RLIMIT_CPU, ctypes.byref(R(1000, 1000)))\n"
            "print(rc, ctypes.get_errno(), resource.getrlimit(resource.RLIMIT_CPU), flush=True)\n"
            "while True:\n    pass\n")
    r = contained(pool, code)
    assert r.stdout == "-1 1 (1, 2)\n"          # EPERM; the limits are as the launcher set them
    assert r.verdict == sb.TIME_LIMIT


def test_closing_stdout(pool):
    r = contained(pool, "import os, sys\nos.close(1)\nos.close(2)\nsum(range(1000))\n")
    assert (r.verdict, r.stdout) == (sb.OK, "")
    r = contained(pool, "import os\nos.close(1)\nwhile True:\n    pass\n")
    assert r.verdict == sb.TIME_LIMIT

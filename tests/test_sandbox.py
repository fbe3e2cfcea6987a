"""The sandbox pool (issue 36): results and verdicts, limits, a clean environment, the concurrency bound,
the error when bwrap is missing, no sandbox outliving a killed driver, and @tool(sandbox=True)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from slick.chat.toolcall import ToolCall
from slick.reward import sandbox as sb
from slick.reward.sandbox.command import LAUNCHER
from slick.rollout.tools import ToolSet, load_tools, tool
from tests.sandbox_tools import HostState, make_pool, sandbox_dirs, sandbox_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pool():
    return make_pool(2, wall_seconds=5.0, cpu_seconds=2)


def test_stdin_to_stdout(pool):
    r = pool.run("import sys\nprint(sys.stdin.read()[::-1], end='')\n", "abc\ndef")
    assert (r.verdict, r.stdout, r.exit_code, r.stderr_tail) == ("ok", "fed\ncba", 0, "")
    assert 0 < r.seconds < 5


def test_runtime_error_keeps_the_last_stderr_lines(pool):
    r = pool.run("import sys\nfor i in range(20):\n    print('line', i, file=sys.stderr)\nraise KeyError('boom')\n")
    assert r.verdict == sb.RUNTIME_ERROR and r.exit_code == 1
    lines = r.stderr_tail.splitlines()
    assert len(lines) == 5 and lines[-1] == "KeyError: 'boom'"


def test_exit_codes_and_signals(pool):
    assert pool.run("import sys; sys.exit(3)").exit_code == 3
    r = pool.run("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert (r.verdict, r.exit_code) == (sb.KILLED, 128 + signal.SIGTERM)


def test_environment_and_identity(pool, monkeypatch):
    monkeypatch.setenv("SLICK_TEST_SECRET", "hunter2")
    r = pool.run("import json, os\nprint(json.dumps([dict(os.environ), os.getcwd(), os.getuid() == 0, "
                 "sorted(os.listdir('/')), os.getpid()]))\n")
    env, cwd, is_root, top, pid = json.loads(r.stdout)
    assert "SLICK_TEST_SECRET" not in env and env["HOME"] == "/tmp"
    assert cwd == "/tmp" and is_root is False and pid <= 3         # its own PID namespace
    assert "etc" not in top and "home" not in top and "root" not in top and "sandbox" in top


def test_limits_inside(pool):
    r = pool.run("import resource as r\nprint([r.getrlimit(getattr(r, n)) for n in ('RLIMIT_CPU', 'RLIMIT_AS', "
                 "'RLIMIT_NPROC', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE')])\n",
                 limits=sb.Limits(cpu_seconds=3, memory_mb=300, max_processes=7, file_size_mb=2, open_files=40))
    assert r.stdout == f"[(3, 4), ({300 << 20}, {300 << 20}), (7, 7), ({2 << 20}, {2 << 20}), (40, 40)]\n"


def test_limits_are_checked():
    with pytest.raises(ValueError, match="memory_mb must be a positive number"):
        sb.Limits(memory_mb=0)
    with pytest.raises(ValueError, match="--sandbox-workers must be >= 1"):
        sb.SandboxPool(workers=0)


def test_missing_bwrap_names_the_binary_and_the_install():
    with pytest.raises(sb.SandboxUnavailable, match=r"`bwrap` binary \(bubblewrap\), not found at "
                                                    r"'/nonexistent/bwrap'.*apt-get install bubblewrap"):
        sb.SandboxPool(bwrap="/nonexistent/bwrap")


def test_a_bwrap_that_cannot_start_is_reported():
    where = tempfile.mkdtemp(prefix="slick-test-fake-bwrap-")   # /tmp: runnable by `nobody` too, when root
    try:
        os.chmod(where, 0o755)
        fake = os.path.join(where, "bwrap")
        with open(fake, "w") as fh:
            fh.write("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
        os.chmod(fake, 0o755)
        with pytest.raises(sb.SandboxUnavailable, match="No permissions to create new namespace"):
            sb.SandboxPool(1, bwrap=fake).check()
        if os.geteuid() == 0:           # as root the sandbox starts as `nobody`, who cannot enter a 0700 dir
            pool = sb.SandboxPool(1, bwrap=fake)
            os.chmod(where, 0o700)
            with pytest.raises(sb.SandboxUnavailable, match="cannot run .*Permission denied"):
                pool.run("print(1)")
    finally:
        shutil.rmtree(where)


def test_at_most_workers_at_once(pool):
    code = "import time\nt0 = time.time()\ntime.sleep(0.6)\nprint(t0, time.time())\n"
    results = pool.run_many([(code, "")] * 6)
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    overlap = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert overlap == 2          # workers=2: two at once, never three


def test_run_async_and_the_default_pool():
    make_pool(1)                 # skips without a sandbox
    r = asyncio.run(sb.default_pool().run_async("print(6 * 7)"))
    assert r.stdout == "42\n"
    assert sb.run("print(input())", "hi\n").stdout == "hi\n"


def test_no_sandbox_outlives_a_killed_driver(tmp_path):
    make_pool(1)
    driver = (f"import sys; sys.path.insert(0, {ROOT!r})\nfrom slick.reward import sandbox\n"
              "print('start', flush=True)\nsandbox.run('import time\\nprint(1, flush=True)\\ntime.sleep(60)', '',"
              " sandbox.Limits(wall_seconds=60))\n")
    before = HostState()
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "start\n"
        deadline = time.monotonic() + 10
        while not sandbox_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sandbox_processes(), "the sandbox never started"
        time.sleep(0.3)
        proc.kill()
        proc.wait(10)
    finally:
        proc.kill()
        proc.wait()
    for d in set(sandbox_dirs()) - set(before.dirs):     # a killed driver cannot remove its program's directory
        shutil.rmtree(os.path.join(tempfile.gettempdir(), d))
    left = sandbox_processes()
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = sandbox_processes()
    assert left == []


# ---------------------------------------------------------------- @tool(sandbox=True)
def test_sandbox_tool_runs_its_source_in_the_sandbox(pool, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    tools = load_tools("tests.sandbox_tool_defs")
    ts = ToolSet(tools, timeout=10, sandbox_pool=pool)
    calls = [ToolCall(name="run_python", arguments={"code": "print(sum(range(10)))"}, id="1"),
             ToolCall(name="escape", arguments={"path": str(secret)}, id="2"),
             ToolCall(name="hang", arguments={}, id="3"),
             ToolCall(name="run_python", arguments={"code": "raise ValueError('nope')"}, id="4")]
    before = HostState()
    got = asyncio.run(ts.run_all(calls))
    before.assert_back()
    assert (got[0].content, got[0].error) == ("45\n", False)
    assert json.loads(got[1].content) == {"read": "FileNotFoundError", "net": 111} and not got[1].error
    assert got[2].error and got[2].content == "Error: tool 'hang' timed out after 1.5 s in the sandbox"
    assert got[3].error and got[3].content.startswith("Error: tool 'run_python' failed in the sandbox "
                                                      "(runtime_error)")
    assert "ValueError: nope" in got[3].content


def test_sandbox_tool_refuses_unsafe_and_env():
    with pytest.raises(TypeError, match="drop unsafe=True"):
        tool(lambda: 1, sandbox=True, unsafe=True)


def test_launcher_is_the_documented_one():
    assert "resource.setrlimit" in LAUNCHER and "os.execv" in LAUNCHER

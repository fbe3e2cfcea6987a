"""Unsafe tools (issue 30, findings 6/8): each call is a process group of its own, killed whole when the call
ends or times out; it sees none of the driver's environment; a grandchild holding stdout cannot turn a
finished call into a timeout."""
import asyncio
import json
import os
import time
from pathlib import Path

import psutil
import pytest

from slick.chat.toolcall import ToolCall
from slick.rollout.tools import ToolSet, load_tools, tool

CLEAN_KEYS = {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PYTHONIOENCODING", "PYTHONPATH"}


@pytest.fixture(scope="module")
def toolset():
    return ToolSet(load_tools("tests.security_tools"), timeout=30.0, max_output_chars=100_000)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE   # a zombie has exited (init reaps it)
    except psutil.NoSuchProcess:
        return False


def _kill(pid: int) -> None:
    """Clean up after a failing test: the grandchild must not outlive it."""
    try:
        if _alive(pid):
            os.kill(pid, 9)
    except (ProcessLookupError, psutil.Error):
        pass


def _pid(pid_file: Path) -> int:
    assert pid_file.exists(), "the tool did not start its grandchild"
    return int(pid_file.read_text())


def _call_spawning(toolset, name: str, pid_file: Path):
    """Run tool ``name`` (which starts a grandchild and writes its pid): (result, seconds taken, grandchild pid)."""
    t0 = time.perf_counter()
    r = asyncio.run(toolset.run(ToolCall(name, {"pid_file": str(pid_file)})))
    return r, time.perf_counter() - t0, _pid(pid_file)


def test_a_timed_out_unsafe_tool_is_killed_with_its_grandchildren(toolset, tmp_path):
    r, took, pid = _call_spawning(toolset, "spawn_then_hang", tmp_path / "grandchild.pid")
    try:
        assert (r.content, r.error) == ("Error: tool 'spawn_then_hang' timed out after 5 s (its process was "
                                        "killed)", True)
        assert took < 9.0
        assert not _alive(pid), f"grandchild {pid} outlived its timed-out tool"
    finally:
        _kill(pid)


def test_a_grandchild_holding_stdout_does_not_hold_a_finished_call(toolset, tmp_path):
    r, took, pid = _call_spawning(toolset, "spawn_and_return", tmp_path / "grandchild.pid")
    try:
        assert (r.content, r.error) == ("the tool's value", False)
        assert took < 8.0, f"the call took {took:.1f} s: it waited for the grandchild (timeout 20 s)"
        assert not _alive(pid), f"grandchild {pid} outlived its tool's call"
    finally:
        _kill(pid)


def test_a_cancelled_call_kills_the_tools_process_group(toolset, tmp_path):
    pid_file = tmp_path / "grandchild.pid"

    async def cancel_once_started():
        task = asyncio.ensure_future(toolset.run(ToolCall("spawn_then_wait", {"pid_file": str(pid_file)})))
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    took = asyncio.run(cancel_once_started())
    pid = _pid(pid_file)
    try:
        assert took < 5.0, f"cancelling took {took:.1f} s: it waited for the grandchild"
        assert not _alive(pid), f"grandchild {pid} outlived its cancelled tool call"
    finally:
        _kill(pid)


def test_an_unsafe_tool_sees_a_clean_environment_not_the_drivers(toolset, monkeypatch):
    monkeypatch.setenv("SLICK_TEST_SECRET", "hunter2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    r = asyncio.run(toolset.run(ToolCall("environment", {})))
    assert not r.error, r.content
    got = json.loads(r.content)
    env = got["env"]
    assert set(env) == CLEAN_KEYS
    assert "hunter2" not in r.content and "sk-test" not in r.content
    assert env["LANG"] == env["LC_ALL"] == "C.UTF-8"
    assert env["HOME"] == env["TMPDIR"] and env["HOME"] != os.environ.get("HOME")
    assert got["home_is_dir"] is True
    assert not Path(env["HOME"]).exists()          # the private HOME went with the call
    assert env["PATH"].split(os.pathsep)[1:] == ["/usr/local/bin", "/usr/bin", "/bin"]


def test_an_unsafe_tool_gets_exactly_the_driver_variables_it_names(toolset, monkeypatch):
    monkeypatch.setenv("SLICK_TEST_SECRET", "hunter2")
    monkeypatch.setenv("SLICK_TEST_ALLOWED", "yes")
    r = asyncio.run(toolset.run(ToolCall("environment_with_allowed", {})))
    assert not r.error, r.content
    env = json.loads(r.content)
    assert set(env) == CLEAN_KEYS | {"SLICK_TEST_ALLOWED"}
    assert env["SLICK_TEST_ALLOWED"] == "yes"


def test_tool_env_is_checked():
    with pytest.raises(TypeError, match=r"@tool\(env=...\): expected a list of environment variable names, "
                                        r"got 'API_KEY'"):
        tool(unsafe=True, env="API_KEY")
    with pytest.raises(TypeError, match=r"@tool\(env=\['API_KEY'\]\): only an unsafe tool's process gets a "
                                        r"filtered environment"):
        tool(env=["API_KEY"])

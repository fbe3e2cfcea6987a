"""MCP tools (slick/rollout/mcp.py) against real MCP servers written with the SDK: the example calculator server
(examples/mcp_tools/server.py) over stdio and streamable HTTP, and a test server whose tools hang or crash it.

The tiny random model does not write tool calls, so the rollout test plugs in a parser that calls the calculator
after every turn; the server, the session, the chat-template delta and the loss mask are the code users run.
"""
import asyncio
import copy
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slick.chat.toolcall import ToolCall
from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.data.source import DataSource
from slick.engine.local import LocalEngine
from slick.reward.hub import RewardHub
from slick.rollout.manager import RolloutManager
from slick.rollout.mcp import McpStartError, url_problem
from slick.rollout.tools import ToolSet, run_tools

pytest.importorskip("mcp")

ROOT = Path(__file__).resolve().parent.parent
SERVER = f"{sys.executable} {ROOT / 'examples' / 'mcp_tools' / 'server.py'}"

FLAKY_SERVER = textwrap.dedent('''
    import os, time
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("flaky", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text."""
        return text

    @server.tool()
    def slow(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "done"

    @server.tool()
    def crash() -> str:
        """Kill the server."""
        os._exit(3)

    if __name__ == "__main__":
        server.run()
''')


def calculator_calls(text):
    """After every turn: one calculator call (the tiny model writes none itself)."""
    return [{"name": "calculator", "arguments": {"expression": "347 * 28"}}]


def cfg_for(**kw):
    base = dict(dtype="fp32", device="cpu", seed=7, rm_type="exact", rollout_batch_size=1, n_samples_per_prompt=2,
                rollout_max_response_len=200, tool_timeout=20.0)
    base.update(kw)
    return validate_config(Config.from_flat(base), check_files=False)


# ------------------------------------------------------------------ the rollout: listed, called, masked
def test_mcp_tool_called_in_rollout_and_masked(tiny_model_dir):
    from slick.models.tiny import load_demo_tokenizer

    tok = copy.deepcopy(load_demo_tokenizer())
    cfg = cfg_for(hf_checkpoint=str(tiny_model_dir), mcp_server=SERVER, max_turns=2, max_tokens_per_turn=6,
                  tool_parser="tests.test_envs_mcp:calculator_calls")
    msgs = [{"role": "user", "content": "What is 347 * 28?"}]
    rows = [{"prompt_index": 0, "prompt": msgs, "tools": None, "label": "9716", "metadata": {},
             "prompt_ids": tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)["input_ids"]}]
    engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=4, seed=0)
    manager = RolloutManager(cfg, DataSource(rows, 2), engine, RewardHub(cfg), tok)

    async def go():
        try:
            listed = manager.tools.schemas()
            groups, metrics = await manager.generate_rollout(0)
            return listed, groups, metrics
        finally:
            await manager.close()
    listed, groups, metrics = asyncio.run(go())
    assert [s["function"]["name"] for s in listed] == ["calculator"]
    assert listed[0]["function"]["parameters"]["required"] == ["expression"]      # the server's own schema
    assert metrics["rollout/mcp_calls"] == 2.0 and metrics["rollout/mcp_errors"] == 0.0
    assert metrics["rollout/tool_calls/mean"] == 1.0 and metrics["rollout/tool_errors"] == 0
    for s in groups[0]:
        st = s.metadata["multiturn"]
        assert st["turns"] == 2
        tool_msgs = [m for m in st["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in tool_msgs] == ["9716"]
        # the tool turn's tokens: loss mask 0, logprob 0; the policy's: mask 1
        zero = [i for i, m in enumerate(s.loss_mask) if m == 0]
        assert zero and "9716" in tok.decode([s.response_ids[i] for i in zero])
        assert "9716" not in tok.decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 1])
        assert all(s.rollout_logprobs[i] == 0.0 for i in zero)
        assert sum(s.loss_mask) >= 2
    assert manager.tools.remote._closed          # the session ended with the manager


# ------------------------------------------------------------------ a slow or crashing server: failed calls
def test_mcp_slow_and_crashing_tools_are_failed_calls(tmp_path):
    server = tmp_path / "flaky_server.py"
    server.write_text(FLAKY_SERVER)
    cfg = cfg_for(mcp_server=f"{sys.executable} {server}", max_turns=2, tool_timeout=1.5)
    tools = ToolSet.from_config(cfg)
    assert sorted(tools.remote.names) == ["crash", "echo", "slow"]

    async def go():
        out = {}
        t0 = time.perf_counter()
        out["slow"] = await tools.call("slow", {"seconds": 30})
        out["slow_s"] = time.perf_counter() - t0
        out["after_slow"] = await tools.call("echo", {"text": "still here"})
        out["crash"] = await tools.call("crash")
        out["after_crash"] = await tools.call("echo", {"text": "back"})     # the server was started again
        out["bad"] = await tools.call("echo", {"nope": 1})
        out["metrics"] = tools.metrics()
        await tools.close()
        out["closed"] = await tools.call("echo", {"text": "x"})
        return out
    out = asyncio.run(go())
    assert out["slow"].error and out["slow"].content.startswith("Error: tool 'slow' timed out after 1.5 s")
    assert out["slow_s"] < 5.0
    assert (out["after_slow"].error, out["after_slow"].content) == (False, "still here")
    assert out["crash"].error and "closed the connection" in out["crash"].content
    assert (out["after_crash"].error, out["after_crash"].content) == (False, "back")
    assert out["bad"].error and out["bad"].content.startswith("Error: tool 'echo' failed on the MCP server:")
    assert out["metrics"] == {"rollout/mcp_calls": 5.0, "rollout/mcp_errors": 3.0, "rollout/mcp_timeouts": 1.0,
                              "rollout/mcp_restarts": 1.0}
    assert out["closed"].error and "closed" in out["closed"].content


def test_mcp_server_that_does_not_start_stops_the_run_at_start():
    cfg = cfg_for(mcp_server=f"{sys.executable} -c 'import sys; sys.exit(2)'", max_turns=2, mcp_startup_timeout=20)
    with pytest.raises(McpStartError, match="could not be started and listed"):
        ToolSet.from_config(cfg)


# ------------------------------------------------------------------ streamable HTTP, loopback
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mcp_url_streamable_http():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "mcp_tools" / "server.py"), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        cfg = cfg_for(mcp_url=f"http://127.0.0.1:{port}/mcp", max_turns=2)
        tools = ToolSet.from_config(cfg)

        async def go():
            try:
                return await tools.call("calculator", {"expression": "(2 + 3) * 4"})
            finally:
                await tools.close()
        r = asyncio.run(go())
        assert (r.error, r.content) == (False, "20")
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("url, allow, problem", [
    ("http://127.0.0.1:8000/mcp", False, None), ("http://localhost/mcp", False, None),
    ("http://[::1]:9/mcp", False, None), ("http://10.1.2.3/mcp", False, "not a loopback address"),
    ("https://tools.example.com/mcp", False, "--mcp-allow-remote"), ("https://tools.example.com/mcp", True, None),
    ("ftp://127.0.0.1/x", True, "expected an http(s)"),
])
def test_mcp_url_loopback_unless_allowed(url, allow, problem):
    got = url_problem(url, allow)
    assert (got is None) if problem is None else (problem in got)


@pytest.mark.parametrize("kw, msg", [
    (dict(mcp_url="http://10.1.2.3/mcp", max_turns=2), "not a loopback address"),
    (dict(mcp_server="python s.py", max_turns=1), "need --max-turns >= 2"),
    (dict(mcp_server="python s.py", mcp_url="http://127.0.0.1/mcp", max_turns=2), "give one MCP server"),
    (dict(mcp_server="  ", max_turns=2), "--mcp-server: empty command"),
    (dict(mcp_server="python s.py", max_turns=2, mcp_startup_timeout=0), "--mcp-startup-timeout must be > 0"),
])
def test_mcp_flags_refused(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        validate_config(Config.from_flat(dict(rm_type="exact", **kw)), check_files=False)
    validate_config(Config.from_flat(dict(rm_type="exact", mcp_server="python s.py", agent_function_path=
                                          "tests.test_envs_mcp:calculator_calls")), check_files=False)


async def mcp_agent(args, sample, base_url):
    """A black-box agent that shows the policy the MCP tools, then calls one itself (slick.rollout.tools.run_tools)."""
    import aiohttp

    tools = run_tools(args)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base_url}/chat/completions", json={
                "model": "policy", "messages": [{"role": "user", "content": sample.prompt}],
                "tools": tools.schemas(), "max_tokens": 4}) as r:
            assert r.status == 200, await r.text()
    result = await tools.call("calculator", {"expression": "347 * 28"})
    return 1.0 if (result.error, result.content) == (False, "9716") else 0.0


def test_agent_session_calls_the_run_mcp_tools(tiny_model_dir):
    from slick.models.tiny import load_demo_tokenizer

    tok = copy.deepcopy(load_demo_tokenizer())
    cfg = cfg_for(hf_checkpoint=str(tiny_model_dir), mcp_server=SERVER,
                  agent_function_path="tests.test_envs_mcp.mcp_agent", rollout_max_response_len=8)
    rows = [{"prompt_index": 0, "prompt": "What is 347 * 28?", "tools": None, "label": "9716", "metadata": {},
             "prompt_ids": tok("What is 347 * 28?", add_special_tokens=False)["input_ids"]}]
    engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=4, seed=0)
    manager = RolloutManager(cfg, DataSource(rows, 2), engine, RewardHub(cfg), tok)

    async def go():
        try:
            return await manager.generate_rollout(0)
        finally:
            await manager.close()
    groups, metrics = asyncio.run(go())
    assert [s.reward for s in groups[0]] == [1.0, 1.0]
    assert metrics["rollout/mcp_calls"] == 2.0 and metrics["rollout/mcp_errors"] == 0.0
    with pytest.raises(ValueError, match="no tools for agents"):
        run_tools(cfg)                           # forgotten when the manager closed


def test_run_tools_needs_registered_tools():
    cfg = Config.from_flat(dict(rm_type="exact"))
    with pytest.raises(ValueError, match="no tools for agents"):
        run_tools(cfg)


def test_mcp_env_names_pass_through(tmp_path, monkeypatch):
    """The stdio server gets the SDK's safe environment plus the --mcp-env names, and no other variable."""
    server = tmp_path / "env_server.py"
    server.write_text(textwrap.dedent('''
        import json, os
        from mcp.server.mcpserver import MCPServer
        server = MCPServer("env", log_level="WARNING")

        @server.tool()
        def env() -> str:
            """The variables this process sees."""
            return json.dumps(sorted(os.environ))

        server.run()
    '''))
    monkeypatch.setenv("SLICK_TEST_PASSED", "1")
    monkeypatch.setenv("SLICK_TEST_SECRET", "2")
    tools = ToolSet.from_config(cfg_for(mcp_server=f"{sys.executable} {server}", max_turns=2,
                                        mcp_env=["SLICK_TEST_PASSED"]))

    async def go():
        try:
            return await tools.call("env")
        finally:
            await tools.close()
    seen = json.loads(asyncio.run(go()).content)
    assert "SLICK_TEST_PASSED" in seen and "SLICK_TEST_SECRET" not in seen and "PATH" in seen
    assert os.environ["SLICK_TEST_SECRET"] == "2"


@pytest.mark.slow
def test_readme_command_runs_one_step(tiny_model_dir, tmp_path):
    from tests.envs_readme import run_readme

    rows = run_readme("mcp_tools", tiny_model_dir, tmp_path, {"data/mcp_tools": str(tmp_path / "data"),
                                                              "test.jsonl": "test.jsonl@[0:4]"})
    step = [r for r in rows if "train/loss" in r]
    assert len(step) == 1 and step[0]["rollout/turns/mean"] >= 1.0 and "rollout/mcp_calls" in step[0]

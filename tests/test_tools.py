"""Tools: loading by dotted path, schemas, and every failure turned into an error tool message."""
import asyncio
import os
import time

import pytest

from slick.chat.toolcall import ToolCall
from slick.rollout.tools import ToolSet, function_schema, load_tools
from tests import agent_tools

MB = agent_tools.MB


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def toolset():
    return ToolSet(load_tools("tests.agent_tools"), timeout=5.0, max_output_chars=1000)


def test_load_module_list_dict_and_errors():
    names = set(load_tools("tests.agent_tools"))
    assert names == {"add", "echo", "boom", "hang_sync", "hang_async", "big", "print_big", "crash", "hang_unsafe",
                     "pid", "unsafe_add"}  # `tool`, `asyncio`, ... imported into the module are not tools
    assert list(load_tools("tests.agent_tools:GOOD")) == ["add", "echo"]
    assert list(load_tools("tests.agent_tools.GOOD")) == ["add", "echo"]
    with pytest.raises(ValueError, match="--tool-path 'tests.nope': module 'tests.nope' not found"):
        load_tools("tests.nope")
    with pytest.raises(ValueError, match="--tool-path 'tests.agent_tools:MISSING': 'tests.agent_tools' has no "
                                         "attribute 'MISSING'"):
        load_tools("tests.agent_tools:MISSING")
    with pytest.raises(ValueError, match="expected a module, a list or dict of functions, or a function; got int"):
        load_tools("tests.agent_tools:MB")


def test_schema_from_signature_and_docstring():
    assert function_schema("add", agent_tools.add) == {
        "type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}}}
    assert function_schema("echo", agent_tools.echo)["function"]["parameters"]["required"] == []


def test_good_tools_sync_async_and_unsafe(toolset):
    r = run(toolset.run_all([ToolCall("add", {"a": 2, "b": 3}), ToolCall("echo", {"text": "hi"}),
                             ToolCall("unsafe_add", {"a": 2, "b": 40}), ToolCall("pid", {})]))
    assert [(x.content, x.error) for x in r[:3]] == [("5", False), ("hi", False), ('{"sum": 42}', False)]
    assert int(r[3].content) != os.getpid()
    assert r[0].message() == {"role": "tool", "name": "add", "tool_call_id": r[0].call.id, "content": "5"}


def test_failures_become_error_messages(toolset):
    t0 = time.perf_counter()
    calls = [ToolCall("boom", {"x": 7}), ToolCall("hang_sync", {}), ToolCall("hang_async", {}),
             ToolCall("crash", {}), ToolCall("hang_unsafe", {}), ToolCall("nope", {}),
             ToolCall("add", {"a": 1}), ToolCall("", error="tool call is not valid JSON")]
    r = run(toolset.run_all(calls))
    assert time.perf_counter() - t0 < 30.0      # bounded by the timeouts (hang_unsafe would sleep 60 s)
    assert all(x.error for x in r)
    got = [x.content for x in r]
    assert got[0] == "Error: tool 'boom' raised RuntimeError: tool exploded on 7"
    assert got[1] == "Error: tool 'hang_sync' timed out after 0.3 s"
    assert got[2] == "Error: tool 'hang_async' timed out after 0.3 s"
    assert got[3].startswith("Error: tool 'crash' crashed (its process exited with code 3")
    assert got[4] == "Error: tool 'hang_unsafe' timed out after 0.5 s (its process was killed)"
    assert got[5].startswith("Error: unknown tool 'nope' (available: add, big, boom, crash, echo,")
    assert got[6].startswith("Error: bad arguments for 'add': missing a required argument: 'b'")
    assert got[7] == "Error: tool call is not valid JSON"


def test_big_outputs_are_truncated(toolset):
    r_big, r_print = run(toolset.run_all([ToolCall("big", {}), ToolCall("print_big", {})]))
    assert not r_big.error and r_big.truncated
    assert r_big.content == "x" * 1000 + f"\n...[truncated {MB - 1000} characters]"
    assert not r_print.error and r_print.truncated
    assert r_print.content.startswith("y" * 1000 + "\n...[truncated ")
    assert len(r_print.content) < 1100

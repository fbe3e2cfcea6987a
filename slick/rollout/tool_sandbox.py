"""Running one ``@tool(sandbox=True)`` call in the sandbox (:mod:`slick.reward.sandbox`).

The tool's own source (the function, decorators dropped) is the program: it runs in a fresh bubblewrap
sandbox with the interpreter and its standard library only, no network, no view of the host's files, and the
pool's limits (``--sandbox-*``; the wall clock is the tool's timeout). So the function must be self-contained:
its imports inside its body, standard library only, no globals of its module. The call's arguments arrive as
JSON on stdin; what it prints comes before its result, as for unsafe tools. A tool that raises, runs out of
time, memory or output answers with an ``Error:`` message naming the verdict and the last lines of stderr.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import secrets
import textwrap
from typing import Callable

from slick.reward.sandbox import Limits, SandboxPool

CALL = '''

def __slick_tool_call(token):
    import asyncio as _asyncio, inspect as _inspect, json as _json, os as _os, sys as _sys
    value = {name}(**_json.loads(_sys.stdin.read()))
    if _inspect.isawaitable(value):
        value = _asyncio.run(value)
    if not isinstance(value, str):
        try:
            value = "" if value is None else _json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            value = str(value)
    try:
        _sys.stdout.flush()
    except BaseException:
        pass
    _os.write(1, (token + _json.dumps(value) + "\\n").encode())


__slick_tool_call({token!r})
'''


def tool_program(fn: Callable, token: str) -> str:
    """The program that runs ``fn`` in the sandbox: its source without decorators, then the call."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise ValueError(f"sandboxed tool {getattr(fn, '__name__', fn)!r}: its source is not available ({e})") \
            from None
    node = ast.parse(source).body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"sandboxed tool {fn!r} must be a function defined with def")
    node.decorator_list = []
    return ast.unparse(node) + CALL.format(name=node.name, token=token)


async def run_in_sandbox(fn: Callable, arguments: dict, timeout: float, pool: SandboxPool) -> tuple[str, bool]:
    """Call ``fn(**arguments)`` in the sandbox (module doc); (text, error)."""
    name = getattr(fn, "__name__", "tool")
    token = "@@slick-tool-" + secrets.token_hex(16)
    try:
        program = tool_program(fn, token)
    except ValueError as e:
        return f"Error: {e}", True
    limits: Limits = dataclasses.replace(pool.limits, wall_seconds=timeout)
    r = await pool.run_async(program, json.dumps(arguments), limits)
    at = r.stdout.rfind(token)
    if r.ok and at >= 0:
        try:
            value = json.loads(r.stdout[at + len(token):].split("\n", 1)[0])
        except ValueError:
            value = None
        if isinstance(value, str):
            return r.stdout[:at] + value, False
    if r.verdict == "time_limit":
        return f"Error: tool {name!r} timed out after {timeout:g} s in the sandbox", True
    detail = f": {' | '.join(r.stderr_tail.splitlines()[-3:])}" if r.stderr_tail else ""
    return f"Error: tool {name!r} failed in the sandbox ({r.verdict}){detail}", True

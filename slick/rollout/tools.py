"""Tool implementations for multi-turn rollouts: loading, schemas, safe execution.

**Plugging tools in** (``--tool-path``, any spelling of :func:`slick.plugins.load_function`'s paths):

- a module, ``--tool-path my_pkg.calc_tools``: every public function *defined in* that module is a tool
  (imported helpers and names starting with ``_`` are not);
- an attribute holding a list of functions, ``--tool-path my_pkg.calc_tools:TOOLS`` (names from ``__name__``),
  or a dict ``{"name": function}``.

Functions may be sync or ``async``. Arguments come from the call's JSON ``arguments`` as keyword arguments;
the return value becomes the tool message's text (``str`` as is, anything else as JSON). The schema shown to
the policy (OpenAI function format) is built from the signature (``int``/``float``/``str``/``bool``/``list``/
``dict`` annotations) and the docstring's first paragraph, unless ``@tool(schema=...)`` gives one. A dataset's
``--tool-key`` schemas, when present, are what the chat template shows instead.

``@tool(unsafe=True)`` runs a function in a fresh Python subprocess per call (``python -m
slick.rollout.tool_process``, see :mod:`slick.rollout.tool_process`): it must be importable by module and name;
whatever it prints is captured and put before its result; a crash, a hang or a kill of that process becomes an
error message. That process is a process group of its own, killed whole (grandchildren too) when the call
ends or times out, and gets a clean environment: none of the driver's variables (API keys, tokens) except
those named in ``@tool(unsafe=True, env=["NAME", ...])``. ``@tool(timeout=S)`` overrides ``--tool-timeout`` for
one tool.

``@tool(sandbox=True)`` runs the function's own source in the bubblewrap sandbox instead
(:mod:`slick.rollout.tool_sandbox`): no network, no host files, the ``--sandbox-*`` limits. The function must be
self-contained (imports inside its body, standard library only); the sandbox pool is built from the run's config.

**MCP servers** (``--mcp-server CMD`` / ``--mcp-url URL``): the server's tools join the set, with the server's own
schemas; :class:`ToolSet` hands their calls to :class:`slick.rollout.mcp.McpTools` (one session per run, closed by
:meth:`ToolSet.close`). A black-box agent reaches the same set with :func:`run_tools`.

**Failures never crash a rollout.** A tool that raises, times out (``--tool-timeout``), is unknown, gets bad
arguments, or whose call could not be parsed, answers with a tool message starting ``Error:`` and counts in
``rollout/tool_errors``. Output longer than ``--tool-max-output-chars`` is cut, ending with
``...[truncated N characters]`` (not an error). A sync in-process tool that hangs cannot be killed: its daemon
thread is abandoned after the timeout; mark such tools unsafe so they run (and die) in a subprocess.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
import types
from typing import Callable, Optional, Sequence

from slick.config import Config, ConfigView
from slick.plugins import _import
from slick.reward.sandbox import SandboxPool, default_pool, pool_from_config
from slick.rollout.mcp import McpTools
from slick.rollout.tool_process import run_in_subprocess, to_text
from slick.rollout.tool_sandbox import run_in_sandbox
from slick.chat.toolcall import ToolCall

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


def tool(fn: Optional[Callable] = None, *, unsafe: bool = False, timeout: Optional[float] = None,
         name: Optional[str] = None, schema: Optional[dict] = None, env: Sequence[str] = (), sandbox: bool = False):
    """Mark a function as a tool with options (usable bare, ``@tool``, or with arguments). ``env``: names of
    the driver's environment variables an unsafe tool's process gets (it gets no others)."""
    if isinstance(env, str) or not all(isinstance(k, str) and k for k in env):
        raise TypeError(f"@tool(env=...): expected a list of environment variable names, got {env!r}")
    if sandbox and (unsafe or env):
        raise TypeError("@tool(sandbox=True) runs in the sandbox with no environment of the driver: "
                        "drop unsafe=True and env=")
    if env and not unsafe:
        raise TypeError(f"@tool(env={list(env)!r}): only an unsafe tool's process gets a filtered environment; "
                        f"a safe tool runs in the driver and sees all of it (add unsafe=True)")

    def mark(f):
        f.__slick_tool__ = {"unsafe": unsafe, "timeout": timeout, "name": name, "schema": schema,
                            "env": tuple(env), "sandbox": bool(sandbox)}
        return f
    return mark(fn) if fn is not None else mark


@dataclasses.dataclass
class ToolResult:
    call: ToolCall
    content: str
    error: bool
    seconds: float
    truncated: bool = False

    def message(self) -> dict:
        """The tool message for the chat template."""
        return {"role": "tool", "name": self.call.name, "tool_call_id": self.call.id, "content": self.content}


def function_schema(name: str, fn: Callable) -> dict:
    """OpenAI function schema from a signature and docstring (or the one given to ``@tool(schema=)``)."""
    opts = getattr(fn, "__slick_tool__", {})
    if opts.get("schema"):
        return opts["schema"]
    props, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        ann = p.annotation
        if isinstance(ann, str):
            ann = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict}.get(ann)
        props[p.name] = {"type": _JSON_TYPES[ann]} if ann in _JSON_TYPES else {}
        if p.default is p.empty:
            required.append(p.name)
    doc = inspect.getdoc(fn) or ""
    return {"type": "function", "function": {"name": name, "description": doc.split("\n\n")[0].strip(),
                                             "parameters": {"type": "object", "properties": props,
                                                            "required": required}}}


def load_tools(path: str, flag: str = "--tool-path") -> dict[str, Callable]:
    """``{name: function}`` from a module path or a ``module:ATTR`` list/dict (module doc)."""
    if not path or not isinstance(path, str):
        raise ValueError(f"{flag}: expected a module path or 'module:ATTR', got {path!r}")
    path = path.strip()
    obj = None
    if ":" in path:
        mod_name, _, attr = path.partition(":")
        obj = _import(mod_name, path, flag)
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ValueError(f"{flag} {path!r}: {mod_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
    else:
        try:
            obj = _import(path, path, flag)
        except ValueError as first:
            mod_name, _, attr = path.rpartition(".")
            if not mod_name:
                raise
            obj = getattr(_import(mod_name, path, flag), attr, None)
            if obj is None:  # neither a module nor an attribute of its parent: the import error says why
                raise first from None
    if isinstance(obj, types.ModuleType):
        found = {n: f for n, f in vars(obj).items() if not n.startswith("_") and inspect.isfunction(f)
                 and f.__module__ == obj.__name__}
    elif isinstance(obj, dict):
        found = dict(obj)
    elif isinstance(obj, (list, tuple)):
        found = {getattr(f, "__name__", repr(f)): f for f in obj}
    elif callable(obj):
        found = {obj.__name__: obj}
    else:
        raise ValueError(f"{flag} {path!r}: expected a module, a list or dict of functions, or a function; "
                         f"got {type(obj).__name__}")
    out = {}
    for n, f in found.items():
        if not callable(f):
            raise ValueError(f"{flag} {path!r}: tool {n!r} is a {type(f).__name__}, not a function")
        out[getattr(f, "__slick_tool__", {}).get("name") or n] = f
    if not out:
        raise ValueError(f"{flag} {path!r}: no tools found (a module needs public functions defined in it)")
    return out


def _in_daemon_thread(fn, kwargs) -> asyncio.Future:
    """Run ``fn(**kwargs)`` in a daemon thread (never joined at exit) and return a future of its result."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def done(ok, value):
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def run():
        try:
            r = fn(**kwargs)
            loop.call_soon_threadsafe(done, True, r)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            try:
                loop.call_soon_threadsafe(done, False, e)
            except RuntimeError:
                pass  # the loop closed while the tool ran

    threading.Thread(target=run, daemon=True, name=f"slick-tool-{getattr(fn, '__name__', 'fn')}").start()
    return fut


class ToolSet:
    """Named tools with their schemas; :meth:`run_all` executes a turn's calls concurrently. ``remote``: tools
    another process serves (:class:`slick.rollout.mcp.McpTools`: ``names``, ``schemas()``, ``async call(name,
    arguments, timeout) -> (text, error)``, ``metrics()``, ``aclose()``), run beside the Python ones."""

    def __init__(self, tools: dict[str, Callable], timeout: float = 10.0, max_output_chars: int = 4000,
                 sandbox_pool: Optional[SandboxPool] = None, remote: Optional[McpTools] = None):
        self.tools, self.timeout, self.max_output_chars = dict(tools), float(timeout), int(max_output_chars)
        self.sandbox_pool = sandbox_pool       # runs @tool(sandbox=True) tools (from_config builds one when needed)
        self.remote = remote
        clash = sorted(set(self.tools) & set(remote.names)) if remote is not None else []
        if clash:
            raise ValueError(f"tool name(s) {', '.join(clash)} both in --tool-path and on the MCP server "
                             f"{remote.label!r}: rename one")

    @classmethod
    def from_config(cls, cfg: Config | ConfigView) -> Optional["ToolSet"]:
        """The tools of --tool-path and of --mcp-server / --mcp-url (agent group; the MCP session is started here,
        once), sandboxed with the sandbox group's limits where a tool asks. None when there are none."""
        cfg = cfg.view("agent", "sandbox")
        if not (cfg.tool_path or cfg.mcp_server or cfg.mcp_url):
            return None
        tools = load_tools(cfg.tool_path) if cfg.tool_path else {}
        wants = any(getattr(f, "__slick_tool__", {}).get("sandbox") for f in tools.values())
        remote = McpTools.from_config(cfg)
        try:
            return cls(tools, cfg.tool_timeout, cfg.tool_max_output_chars,
                       pool_from_config(cfg.sandbox) if wants else None, remote)
        except ValueError:
            if remote is not None:
                remote.close()
            raise

    def schemas(self) -> list[dict]:
        local = [function_schema(n, f) for n, f in self.tools.items()]
        return local + (self.remote.schemas() if self.remote is not None else [])

    async def call(self, name: str, arguments: Optional[dict] = None) -> ToolResult:
        """Run one tool by name (for agents: :func:`run_tools`); failures are results starting ``Error:``."""
        return await self.run(ToolCall(name, dict(arguments or {})))

    def metrics(self) -> dict:
        """rollout/mcp_* counts since the last call (empty without MCP tools)."""
        return self.remote.metrics() if self.remote is not None else {}

    async def close(self) -> None:
        """End what the tool set started (the MCP session); idempotent."""
        if self.remote is not None:
            await self.remote.aclose()

    def _truncate(self, text: str) -> tuple[str, bool]:
        if len(text) <= self.max_output_chars:
            return text, False
        cut = len(text) - self.max_output_chars
        return f"{text[:self.max_output_chars]}\n...[truncated {cut} characters]", True

    async def run(self, call: ToolCall) -> ToolResult:
        t0 = time.perf_counter()
        text, error = await self._run(call)
        text, truncated = self._truncate(text)
        return ToolResult(call, text, error, time.perf_counter() - t0, truncated)

    async def run_all(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return list(await asyncio.gather(*(self.run(c) for c in calls)))

    async def _run(self, call: ToolCall) -> tuple[str, bool]:
        if call.error:
            return f"Error: {call.error}", True
        if self.remote is not None and call.name in self.remote.names:
            return await self.remote.call(call.name, call.arguments, self.timeout)
        fn = self.tools.get(call.name)
        if fn is None:
            known = sorted(self.tools) + (self.remote.names if self.remote is not None else [])
            return f"Error: unknown tool {call.name!r} (available: {', '.join(known)})", True
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as e:
            return f"Error: bad arguments for {call.name!r}: {e}", True
        opts = getattr(fn, "__slick_tool__", {})
        timeout = float(opts.get("timeout") or self.timeout)
        try:
            if opts.get("sandbox"):
                pool = self.sandbox_pool if self.sandbox_pool is not None else default_pool()
                return await run_in_sandbox(fn, call.arguments, timeout, pool)
            if opts.get("unsafe"):
                return await run_in_subprocess(fn, call.arguments, timeout, self.max_output_chars,
                                               opts.get("env", ()))
            if inspect.iscoroutinefunction(fn):
                value = await asyncio.wait_for(fn(**call.arguments), timeout)
            else:
                value = await asyncio.wait_for(_in_daemon_thread(fn, call.arguments), timeout)
                if inspect.isawaitable(value):
                    value = await asyncio.wait_for(value, timeout)
            return to_text(value), False
        except asyncio.TimeoutError:
            return f"Error: tool {call.name!r} timed out after {timeout:g} s", True
        except Exception as e:  # noqa: BLE001 - a tool's failure is the policy's observation
            return f"Error: tool {call.name!r} raised {type(e).__name__}: {e}", True


_RUN_TOOLS: dict[int, ToolSet] = {}


def register_run_tools(args: Config, tools: Optional[ToolSet]) -> None:
    """Make ``tools`` what :func:`run_tools` returns for this run's config (the rollout manager calls this;
    ``None`` forgets it)."""
    if tools is None:
        _RUN_TOOLS.pop(id(args), None)
    else:
        _RUN_TOOLS[id(args)] = tools


def run_tools(args: Config) -> ToolSet:
    """The run's tools for a black-box agent (``--agent-function-path`` with ``--mcp-server`` / ``--mcp-url``):
    ``schemas()`` (OpenAI function schemas, for a request's ``tools``) and ``await call(name, arguments)`` (a
    :class:`ToolResult`: ``content``, ``error``), bounded by ``--tool-timeout``; one MCP session for the whole run.
    ``args`` is the config the agent was handed."""
    tools = _RUN_TOOLS.get(id(args))
    if tools is None:
        raise ValueError("run_tools(args): this run has no tools for agents (pass --mcp-server or --mcp-url with "
                         "--agent-function-path)")
    return tools


"""Tools served over the Model Context Protocol (``--mcp-server CMD`` / ``--mcp-url URL``), for the built-in
multi-turn rollout (:class:`slick.rollout.tools.ToolSet` runs them beside ``--tool-path`` tools) and for black-box
agents (:func:`slick.rollout.tools.run_tools`). ``pip install 'slick[envs]'`` installs the SDK (``mcp``).

**One session per run.** :class:`McpTools` connects once (a stdio server is started as a subprocess with the SDK's
safe environment plus the ``--mcp-env`` names; an HTTP server is reached at its URL), lists the server's tools
(names, descriptions and JSON input schemas, shown to the policy as OpenAI function schemas) and keeps the session
until :meth:`McpTools.close` (the rollout manager's close, at the run's end; at exit otherwise). The session lives on
a thread of its own with its own event loop, so any event loop (the rollout's, an agent's) may call it.

**Failures are tool results, never crashes.** Each call is bounded by ``--tool-timeout`` (plus, when the server
has to be started again first, ``--mcp-startup-timeout`` for that); a tool that reports an
error (``isError``), a call that times out, a server that crashed or closed the connection, or one that cannot be
reached answers with text starting ``Error:``, counted in ``rollout/mcp_errors`` (``rollout/mcp_timeouts`` for the
timed-out ones) and in ``rollout/tool_errors`` like any failed tool. A server that closed the connection is started
again (``rollout/mcp_restarts``) for the next call. A server that
cannot be started or listed when the run starts stops the run at start-up, naming the command or URL.
"""
from __future__ import annotations

import asyncio
import atexit
import ipaddress
import json
import logging
import os
import re
import shlex
import threading
from typing import Any, Optional
from urllib.parse import urlsplit

from slick.config import Config, ConfigView

log = logging.getLogger(__name__)

INSTALL = "pip install 'slick[envs]' (mcp==2.3.0)"


class McpStartError(ValueError):
    """The MCP server could not be started, reached or listed (the message names it and why)."""


def is_loopback_host(host: Optional[str]) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_problem(url: str, allow_remote: bool) -> Optional[str]:
    """Why ``--mcp-url`` cannot be used, or None."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--mcp-url {url!r}: expected an http(s)://HOST[:PORT]/PATH URL"
    if not allow_remote and not is_loopback_host(parts.hostname):
        return (f"--mcp-url {url!r}: {parts.hostname} is not a loopback address; the server would see every tool "
                f"call's arguments; pass --mcp-allow-remote to use it anyway")
    return None


def openai_schema(tool: Any) -> dict:
    """An MCP ``Tool`` as an OpenAI function schema (the server's input schema as the parameters)."""
    params = dict(tool.input_schema or {}) or {"type": "object", "properties": {}}
    desc = tool.description or getattr(tool, "title", None) or ""
    return {"type": "function", "function": {"name": tool.name, "description": desc, "parameters": params}}


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as the tool message's text: its text blocks, one per line; other blocks named; the
    structured content as JSON when there is no text."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        else:
            parts.append(f"[{kind or type(block).__name__}: {getattr(block, 'mime_type', '') or 'not text'}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


class McpTools:
    """The tools of one MCP server (module doc). ``target``: a ``StdioServerParameters`` or a URL."""

    def __init__(self, target: Any, label: str, *, timeout: float = 10.0, startup_timeout: float = 60.0):
        self.target, self.label = target, label
        self.timeout, self.startup_timeout = float(timeout), float(startup_timeout)
        self._schemas: dict[str, dict] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._client = None                 # the connected mcp.Client, on the session thread
        self._stop: Optional[asyncio.Event] = None
        self._owner: Optional[asyncio.Task] = None
        self._connect_lock: Optional[asyncio.Lock] = None
        self._closed = False
        self.counts = {"calls": 0, "errors": 0, "timeouts": 0, "restarts": 0}

    @classmethod
    def from_config(cls, cfg: Config | ConfigView) -> Optional["McpTools"]:
        """The tools of ``--mcp-server`` / ``--mcp-url`` (agent group), connected and listed; None when neither is
        set. Raises :class:`McpStartError` when the server cannot be used."""
        if not (cfg.mcp_server or cfg.mcp_url):
            return None
        try:
            from mcp import StdioServerParameters   # optional dependency: the envs extra
        except ImportError as e:
            raise McpStartError(f"--mcp-server/--mcp-url need the MCP SDK ({e}): {INSTALL}") from None
        if cfg.mcp_url:
            problem = url_problem(cfg.mcp_url, cfg.mcp_allow_remote)
            if problem:
                raise McpStartError(problem)
            target, label = cfg.mcp_url, cfg.mcp_url
        else:
            argv = shlex.split(cfg.mcp_server)
            if not argv:
                raise McpStartError("--mcp-server: empty command")
            from mcp.client.stdio import get_default_environment   # optional dependency: the envs extra
            env = {**get_default_environment(), **{k: os.environ[k] for k in cfg.mcp_env if k in os.environ}}
            target, label = StdioServerParameters(command=argv[0], args=argv[1:], env=env), cfg.mcp_server
        tools = cls(target, label, timeout=cfg.tool_timeout, startup_timeout=cfg.mcp_startup_timeout)
        tools.start()
        return tools

    # ------------------------------------------------------------------ the session thread
    def start(self) -> "McpTools":
        """Start the session thread, connect and list the tools (at most ``startup_timeout`` seconds)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="slick-mcp")
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._connect(first=True), self._loop)
        try:
            fut.result(self.startup_timeout)
        except Exception as e:   # noqa: BLE001 - a timeout or whatever connecting raised
            fut.cancel()
            self.close()
            why = f"no answer within {self.startup_timeout:g} s (--mcp-startup-timeout)" \
                if isinstance(e, TimeoutError) or type(e).__name__ == "TimeoutError" else f"{type(e).__name__}: {e}"
            raise McpStartError(f"MCP server {self.label!r} could not be started and listed: {why}") from None
        atexit.register(self.close)
        log.info("MCP server %r: %d tools (%s)", self.label, len(self._schemas), ", ".join(self._schemas))
        return self

    async def _own(self, ready: asyncio.Future) -> None:
        """Hold one connection: enter the client, publish it, wait for the stop event, leave (same task)."""
        from mcp import Client   # optional dependency: the envs extra
        stop = self._stop = asyncio.Event()
        try:
            async with Client(self.target) as client:
                self._client = client
                ready.set_result(client)
                await stop.wait()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits for the connection
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        finally:
            if self._stop is stop:
                self._client = None

    async def _connect(self, first: bool = False):
        """The connected client: a new connection when there is none (the first, or after a crash)."""
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._client is not None:
                return self._client
            if not first:
                self.counts["restarts"] += 1
                log.warning("MCP server %r: connecting again", self.label)
            ready = asyncio.get_running_loop().create_future()
            self._owner = asyncio.ensure_future(self._own(ready))
            client = await asyncio.shield(ready)   # a caller that gives up does not undo the connection
            if first:
                self._schemas = {t.name: openai_schema(t) for t in await self._list(client)}
            return client

    @staticmethod
    async def _list(client) -> list:
        tools, cursor = [], None
        for _ in range(100):     # pages
            page = await client.list_tools(cursor=cursor)
            tools += list(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tools

    async def _drop(self) -> None:
        """Forget the connection (the server crashed or closed it); the next call connects again."""
        self._client = None
        if self._stop is not None:
            self._stop.set()

    async def _call(self, name: str, arguments: dict, timeout: float) -> tuple[str, bool]:
        from mcp import MCPError   # optional dependency: the envs extra
        client = await self._connect()
        try:   # the caller's wait ends first; the SDK's own read timeout only frees the request after it
            result = await client.call_tool(name, arguments, read_timeout_seconds=timeout + 5.0)
        except MCPError as e:
            if "timed out" in str(e).lower():
                raise asyncio.TimeoutError() from None
            if "closed" in str(e).lower():
                await self._drop()
                return f"Error: tool {name!r}: the MCP server closed the connection ({e}); it is started again " \
                       f"for the next call", True
            return f"Error: tool {name!r}: MCP error: {e}", True
        text = result_text(result)
        if result.is_error:   # the SDK's servers say "Error executing tool NAME: why"
            why = re.sub(rf"^Error executing tool {re.escape(name)}:?\s*", "", text.strip()) or "no details"
            return f"Error: tool {name!r} failed on the MCP server: {why}", True
        return text, False

    # ------------------------------------------------------------------ the caller's side (any event loop)
    @property
    def names(self) -> list[str]:
        return list(self._schemas)

    def schemas(self) -> list[dict]:
        """The server's tools as OpenAI function schemas (listed once, at the start)."""
        return [dict(s) for s in self._schemas.values()]

    async def call(self, name: str, arguments: dict, timeout: Optional[float] = None) -> tuple[str, bool]:
        """(text, error) of one tool call, within ``timeout`` (default ``--tool-timeout``) seconds; never raises
        (module doc)."""
        timeout = float(timeout or self.timeout)
        self.counts["calls"] += 1
        if self._closed or self._loop is None:
            self.counts["errors"] += 1
            return f"Error: tool {name!r}: the MCP session is closed", True
        starting = False
        try:
            if self._client is None:    # (re)start the server first, within --mcp-startup-timeout
                starting = True
                fut = asyncio.run_coroutine_threadsafe(self._connect(), self._loop)
                await asyncio.wait_for(asyncio.wrap_future(fut), self.startup_timeout)
                starting = False
            fut = asyncio.run_coroutine_threadsafe(self._call(name, dict(arguments or {}), timeout), self._loop)
            text, error = await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        except asyncio.TimeoutError:
            self.counts["timeouts"] += 1
            text, error = (f"Error: tool {name!r}: the MCP server {self.label!r} did not start within "
                           f"{self.startup_timeout:g} s" if starting else
                           f"Error: tool {name!r} timed out after {timeout:g} s (MCP server {self.label!r})"), True
        except Exception as e:  # noqa: BLE001 - connecting again failed, or the SDK raised: the call failed
            text, error = f"Error: tool {name!r}: MCP server {self.label!r} failed: {type(e).__name__}: {e}", True
        self.counts["errors"] += bool(error)
        return text, error

    def metrics(self) -> dict:
        """rollout/mcp_* counts since the last call (per rollout step)."""
        out = {f"rollout/mcp_{k}": float(v) for k, v in self.counts.items()}
        self.counts = dict.fromkeys(self.counts, 0)
        return out

    def close(self) -> None:
        """End the session (a stdio server's process exits) and stop the session thread; idempotent."""
        if self._closed or self._loop is None:
            return
        self._closed = True
        loop = self._loop

        async def shutdown():
            await self._drop()
            if self._owner is not None:
                try:
                    await asyncio.wait_for(self._owner, 10.0)
                except BaseException:  # noqa: BLE001 - leaving the session must not fail the run's end
                    pass
        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(15.0)
        except Exception as e:  # noqa: BLE001
            log.warning("MCP server %r: closing the session: %s", self.label, e)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        atexit.unregister(self.close)

    async def aclose(self) -> None:
        """:meth:`close` from an event loop, without blocking it."""
        await asyncio.to_thread(self.close)

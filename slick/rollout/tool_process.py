"""Running one ``@tool(unsafe=True)`` call in a process of its own (``python -m slick.rollout.tool_process``).

The process starts a session of its own (its own process group), in the driver's working directory, with a
fresh private directory (mode 0700, removed after the call) as ``HOME`` and ``TMPDIR``, and a clean
environment: a minimal ``PATH``, ``LANG``/``LC_ALL``, ``HOME``, ``TMPDIR``, ``PYTHONIOENCODING``,
``PYTHONPATH`` (so the tool's module imports) and the driver variables the tool names in
``@tool(unsafe=True, env=[...])``, nothing else (no API keys, tokens or credentials of the driver's
environment).

The request and the result travel as files in that directory; what the tool prints comes back over pipes the
driver owns (capped). The call is over when the tool's own process exits (or at the timeout): then the whole
process group is killed with SIGKILL, so no grandchild outlives the call, and one that keeps the pipes open
cannot hold a finished call until the timeout. (A process that starts a session of its own, e.g. with
``setsid``, leaves the group and is out of reach: unsafe tools are not a sandbox.)
"""
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
from typing import Callable, Sequence

# PATH of an unsafe tool's process: this Python's directory first (``python`` is the one running slick)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
DRAIN_S = 1.0        # after the group is killed, how long to wait for the pipes' last bytes


def to_text(value) -> str:
    """What a tool returned, as the text of its tool message (JSON for what JSON can hold)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def tool_env(work_dir: str, keep: Sequence[str] = ()) -> dict:
    """The whole environment of an unsafe tool's process (module doc); ``keep``: driver variables to pass."""
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + SYSTEM_PATH, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "HOME": work_dir, "TMPDIR": work_dir, "PYTHONIOENCODING": "utf-8",
           "PYTHONPATH": os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)}
    env.update({k: os.environ[k] for k in keep if k in os.environ})
    return env


async def _read_capped(reader: asyncio.StreamReader, cap: int) -> tuple[bytes, int]:
    """Read a stream to its end, keeping the first ``cap`` bytes; returns (kept, bytes dropped)."""
    kept, dropped = bytearray(), 0
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            return bytes(kept), dropped
        room = max(cap - len(kept), 0)
        kept += chunk[:room]
        dropped += max(len(chunk) - room, 0)


class _Pipe:
    """A pipe whose write end the tool's process gets and whose read end the driver reads (capped)."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self.transport = self.task = None

    async def start(self, cap: int) -> None:
        os.close(self.write_fd)      # the child has its copy: EOF comes when the last holder in the group dies
        self.write_fd = None
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                         os.fdopen(self.read_fd, "rb", buffering=0))
        self.read_fd = None
        self.task = asyncio.ensure_future(_read_capped(reader, cap))

    async def result(self, wait_s: float) -> tuple[bytes, int]:
        """What was read, waiting at most ``wait_s`` for the end of the stream (a process out of the group may
        hold it open)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self.task), wait_s)
        except asyncio.TimeoutError:
            return b"", 0

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            if fd is not None:
                os.close(fd)
        self.read_fd = self.write_fd = None
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.transport is not None:
            self.transport.close()


async def _kill_group(pgid: int, wait_s: float = DRAIN_S) -> None:
    """SIGKILL every process of the group ``pgid`` and wait (bounded) until none is left running."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)      # a zombie still counts until its parent (or init) reaps it
        except ProcessLookupError:
            return
        await asyncio.sleep(0.01)


async def run_in_subprocess(fn: Callable, arguments: dict, timeout: float, max_chars: int,
                            env_keys: Sequence[str] = ()) -> tuple[str, bool]:
    """Call ``fn(**arguments)`` in a fresh process (module doc); (text, error)."""
    name = getattr(fn, "__name__", "tool")
    module, qualname = fn.__module__, fn.__qualname__
    if module == "__main__" or "<locals>" in qualname:
        return f"Error: unsafe tool {name!r} must be importable (defined at module level, not in __main__)", True
    work = tempfile.mkdtemp(prefix="slick-tool-")        # mode 0700: this user only
    request_path, result_path = os.path.join(work, "request.json"), os.path.join(work, "result.json")
    out, err, proc = _Pipe(), _Pipe(), None
    try:
        with open(request_path, "w", encoding="utf-8") as fh:
            json.dump({"module": module, "qualname": qualname, "arguments": arguments, "result": result_path}, fh)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "slick.rollout.tool_process", request_path, stdin=subprocess.DEVNULL,
            stdout=out.write_fd, stderr=err.write_fd, env=tool_env(work, env_keys), start_new_session=True)
        await out.start(4 * max_chars + 1024)
        await err.start(4096)
        try:    # the driver owns no pipe of this process: wait() returns when the tool's own process exits
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            return f"Error: tool {name!r} timed out after {timeout:g} s (its process was killed)", True
        finally:
            await _kill_group(proc.pid)     # grandchildren included, also after a clean exit
        (printed, dropped), (err_text, _) = await out.result(DRAIN_S), await err.result(DRAIN_S)
        text = printed.decode("utf-8", "replace")
        if dropped:
            text += f"\n...[truncated {dropped} bytes of printed output]"
        try:
            with open(result_path, encoding="utf-8") as fh:
                result = json.load(fh)
        except (OSError, ValueError):
            tail = err_text.decode("utf-8", "replace").strip().splitlines()[-3:]
            return (f"Error: tool {name!r} crashed (its process exited with code {proc.returncode}"
                    f"{': ' + ' | '.join(tail) if tail else ''})"), True
        if not result.get("ok"):
            return f"Error: tool {name!r} raised {result.get('error')}", True
        return text + result.get("text", ""), False
    finally:
        if proc is not None and proc.returncode is None:
            await _kill_group(proc.pid)     # cancelled while it ran
            try:
                await asyncio.wait_for(proc.wait(), DRAIN_S)
            except asyncio.TimeoutError:
                pass
        out.close()
        err.close()
        shutil.rmtree(work, ignore_errors=True)


def _worker(request_path: str) -> None:
    """Child side of :func:`run_in_subprocess`: read the request file, call the tool, write the result file."""
    import importlib
    import inspect


    with open(request_path, encoding="utf-8") as fh:
        req = json.load(fh)
    try:
        obj = importlib.import_module(req["module"])
        for part in req["qualname"].split("."):
            obj = getattr(obj, part)
        value = obj(**req["arguments"])
        if inspect.isawaitable(value):
            value = asyncio.run(value)
        result = {"ok": True, "text": to_text(value)}
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sys.stdout.flush()
    tmp = req["result"] + ".part"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, req["result"])


if __name__ == "__main__":
    _worker(sys.argv[1])

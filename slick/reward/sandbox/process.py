"""Running one sandbox process to its end: stdin in, stdout/stderr out (capped), a wall-clock deadline.

:func:`run_process` starts the command in a session of its own, feeds ``stdin``, reads both output pipes and
bwrap's JSON status pipe with one ``selectors`` loop on the calling thread, and kills the whole process group
with SIGKILL at the deadline or as soon as stdout or stderr pass the cap. bwrap dies with it, and with bwrap
the sandbox's PID namespace (``--die-with-parent``): no process of the program survives, whatever it forked
or however it detached. With a :class:`Gate`, bwrap's sandbox waits on ``--block-fd`` until the gate has seen
its first process's pid on the status pipe and called ``on_child`` with it (the pool moves it into its memory
cgroup there); should that fail, the sandbox is killed before it ran anything.
"""
from __future__ import annotations

import dataclasses
import json
import os
import selectors
import signal
import subprocess
import time
from typing import Callable, Optional, Sequence

DRAIN_S = 2.0     # after a kill, how long to wait for the pipes to close and the process to be reaped
CHUNK = 65536


@dataclasses.dataclass
class Raw:
    """What happened to one process: exit code (bwrap reports 128 + N for a program killed by signal N),
    output kept (stdout: its first ``cap`` bytes; stderr: its last ``cap`` bytes), why we killed it
    (``"timeout"``, ``"output"`` or ``None``), wall seconds, and whether the sandbox started its program."""
    returncode: Optional[int]
    stdout: bytes
    stderr: bytes
    killed: Optional[str]
    seconds: float
    started: bool
    exit_code: Optional[int] = None      # bwrap's own report of the program's exit code


class _Reader:
    def __init__(self, cap: int, keep_tail: bool):
        self.buf, self.total, self.cap, self.keep_tail = bytearray(), 0, cap, keep_tail

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.keep_tail:
            self.buf += chunk
            del self.buf[:-self.cap or None]
        else:
            self.buf += chunk[:max(self.cap - len(self.buf), 0)]

    @property
    def over(self) -> bool:
        return self.total > self.cap


class Gate:
    """Holds the sandbox at ``--block-fd`` (``block_w``, the write end) until ``on_child(pid)`` returned."""

    def __init__(self, block_w: int, on_child: Callable[[int], None]):
        self.block_w, self.on_child = block_w, on_child

    def feed(self, status: bytes) -> None:
        """Open the gate once ``status`` names the sandbox's first process."""
        if self.block_w < 0:
            return
        pid = _child_pid(status)
        if pid is not None:
            self.on_child(pid)
            os.write(self.block_w, b"1")
            self.close()

    def close(self) -> None:
        if self.block_w >= 0:
            os.close(self.block_w)
            self.block_w = -1


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            return [int(x) for x in fh.read().split()]
    except (OSError, ValueError):
        return []


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL bwrap's child first (the sandbox's init: its death ends the whole PID namespace, even while
    bwrap is still setting it up), then bwrap's process group."""
    for pid in _children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(argv: list[str], stdin: bytes, wall_s: float, cap: int, env: dict, popen_kw: dict,
                status_w: int, status_r: int, child_fds: Sequence[int] = (), gate: Optional[Gate] = None) -> Raw:
    """Run ``argv`` (module doc). ``status_w``/``status_r``: the pipe given to ``--json-status-fd``;
    ``child_fds``: more fds bwrap gets (closed here once it started); ``gate``: see :class:`Gate`."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, start_new_session=True, pass_fds=(status_w, *child_fds), close_fds=True,
                                **popen_kw)
    except BaseException:
        os.close(status_r)
        if gate is not None:
            gate.close()
        raise
    finally:
        for fd in (status_w, *child_fds):
            os.close(fd)
    out, err, status = _Reader(cap, False), _Reader(cap, True), bytearray()
    killed = None
    sel = selectors.DefaultSelector()
    try:
        killed = _pump(proc, sel, stdin, out, err, status, status_r, t0 + wall_s, gate)
    finally:
        if gate is not None and gate.block_w >= 0:       # never opened: the sandbox must not run ungated
            _kill(proc)
            gate.close()
        if killed or proc.poll() is None:
            _kill(proc)
        sel.close()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        os.close(status_r)
        try:
            proc.wait(DRAIN_S)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
    started, exit_code = _status(bytes(status))
    return Raw(proc.returncode, bytes(out.buf), bytes(err.buf), killed, time.monotonic() - t0, started, exit_code)


def _pump(proc, sel, stdin: bytes, out: _Reader, err: _Reader, status: bytearray, status_r: int,
          deadline: float, gate: Optional[Gate]) -> Optional[str]:
    """The selectors loop; returns why the process must be killed, or None when it ended by itself."""
    os.set_blocking(proc.stdin.fileno(), False)
    if stdin:
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    sel.register(status_r, selectors.EVENT_READ, status)
    view, pos = memoryview(stdin), 0
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        for key, _ in sel.select(min(left, 0.5)):
            if key.fileobj is proc.stdin:
                try:
                    pos += os.write(proc.stdin.fileno(), view[pos:pos + CHUNK])
                except (BrokenPipeError, BlockingIOError, OSError) as e:
                    if isinstance(e, BlockingIOError):
                        continue
                    pos = len(view)          # the program closed its stdin or exited: the rest is not wanted
                if pos >= len(view):
                    sel.unregister(proc.stdin)
                    proc.stdin.close()
                continue
            fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
            chunk = os.read(fd, CHUNK)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            if isinstance(key.data, bytearray):
                key.data.extend(chunk[:4096])
                if gate is not None:
                    gate.feed(bytes(key.data))
            else:
                key.data.add(chunk)
                if key.data.over:
                    return "output"
    left = deadline - time.monotonic()
    try:
        proc.wait(max(left, 0.0))
    except subprocess.TimeoutExpired:
        return "timeout"
    return None


def _child_pid(text: bytes) -> Optional[int]:
    """The sandbox's first process (a host pid) from bwrap's status documents, once one names it."""
    decoder, s, i = json.JSONDecoder(), text.decode("utf-8", "replace"), 0
    while i < len(s):
        while i < len(s) and s[i].isspace():
            i += 1
        try:
            doc, i = decoder.raw_decode(s, i)
        except ValueError:
            return None
        if isinstance(doc, dict) and isinstance(doc.get("child-pid"), int):
            return doc["child-pid"]
    return None


def _status(text: bytes) -> tuple[bool, Optional[int]]:
    """(the program was started, its exit code) from bwrap's ``--json-status-fd`` documents."""
    started, code = False, None
    decoder, s, i = json.JSONDecoder(), text.decode("utf-8", "replace"), 0
    while True:
        while i < len(s) and s[i].isspace():
            i += 1
        if i >= len(s):
            return started, code
        try:
            doc, i = decoder.raw_decode(s, i)
        except ValueError:
            return started, code
        if isinstance(doc, dict):
            started = started or "child-pid" in doc
            code = doc.get("exit-code", code)

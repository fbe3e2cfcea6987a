"""The sandbox pool: runs untrusted programs under bubblewrap, at most ``workers`` at once.

``SandboxPool(workers, limits).run(code, stdin)`` writes ``code`` to a fresh directory, runs it in a fresh
sandbox (:mod:`slick.reward.sandbox.command`) and returns a :class:`Result`; the directory is removed after.
Where the host allows it, each program runs in a memory cgroup of its own (:mod:`slick.reward.sandbox.cgroup`;
``pool.cgroup`` says where, None otherwise). A pool that starts removes what a SIGKILLed one left behind
(:mod:`slick.reward.sandbox.owner`).
Callers on many threads share one pool; a caller waits for a free slot. ``run_many`` runs a list of programs
on the pool's own threads, ``run_async`` from an event loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Sequence, Union

from slick.reward.sandbox import cgroup as cgroups
from slick.reward.sandbox import owner, seccomp
from slick.reward.sandbox.command import ENV, SandboxUnavailable, bwrap_argv, default_python, find_bwrap, run_as
from slick.reward.sandbox.limits import Limits, default_workers
from slick.reward.sandbox.process import Gate, Raw, run_process

OK, RUNTIME_ERROR, TIME_LIMIT, MEMORY_LIMIT, OUTPUT_LIMIT, KILLED = (
    "ok", "runtime_error", "time_limit", "memory_limit", "output_limit", "killed")
VERDICTS = (OK, RUNTIME_ERROR, TIME_LIMIT, MEMORY_LIMIT, OUTPUT_LIMIT, KILLED)
STDERR_TAIL_LINES = 5
_MEMORY_SIGNS = ("MemoryError", "Cannot allocate memory", "out of memory")
_OUTPUT_SIGNS = ("File too large", "No space left on device")

Text = Union[str, bytes]


@dataclasses.dataclass
class Result:
    """One program's outcome. ``verdict``: ``ok`` (exit code 0), ``runtime_error`` (another exit code),
    ``time_limit`` (wall clock or CPU seconds), ``memory_limit`` (an allocation failed at the address-space
    limit, or the kernel ended a process of it at its memory cgroup's limit), ``output_limit`` (stdout/stderr
    past the cap, a file past the size limit or /tmp full) or
    ``killed`` (ended by another signal). ``stdout``: the program's output (at most the cap);
    ``stderr_tail``: the last lines of its stderr; ``exit_code``: the program's (128 + N after signal N);
    ``seconds``: wall time, sandbox start-up included."""
    verdict: str
    stdout: str
    stderr_tail: str
    exit_code: Optional[int]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.verdict == OK

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _tail(data: bytes, lines: int = STDERR_TAIL_LINES) -> str:
    return "\n".join(data.decode("utf-8", "replace").rstrip().splitlines()[-lines:])


def classify(raw: Raw, oom_kills: int = 0) -> str:
    """The verdict of a finished sandbox run (see :class:`Result`); ``oom_kills``: processes of it the kernel
    ended at its memory cgroup's limit."""
    if raw.killed == "timeout":
        return TIME_LIMIT
    if raw.killed == "output":
        return OUTPUT_LIMIT
    code = raw.exit_code if raw.exit_code is not None else raw.returncode
    if code == 0:
        return OK
    if oom_kills > 0:
        return MEMORY_LIMIT
    tail = _tail(raw.stderr)
    last = tail.splitlines()[-1] if tail else ""
    if code in (128 + signal.SIGXCPU, -signal.SIGXCPU):
        return TIME_LIMIT
    if code in (128 + signal.SIGXFSZ, -signal.SIGXFSZ) or any(s in last for s in _OUTPUT_SIGNS):
        return OUTPUT_LIMIT
    if any(s in last for s in _MEMORY_SIGNS):
        return MEMORY_LIMIT
    if code is not None and (code < 0 or code > 128):
        return KILLED
    return RUNTIME_ERROR


class SandboxPool:
    """Runs programs in bubblewrap sandboxes, at most ``workers`` at once (default: the cores).

    ``limits``: the default :class:`Limits` (a call may pass its own); ``python``: the interpreter inside
    (default :func:`~slick.reward.sandbox.command.default_python`); ``bwrap``: the binary (default: on PATH).
    Construction raises :class:`SandboxUnavailable` when bwrap is missing; :meth:`check` also starts one
    sandbox and raises it, with bwrap's own message, when this machine cannot create one. ``cgroup``: where
    programs' memory cgroups are made (None: this host allows none; ``cgroup_reason`` says why).
    """

    def __init__(self, workers: Optional[int] = None, limits: Optional[Limits] = None,
                 python: Optional[str] = None, bwrap: Optional[str] = None):
        self.workers = default_workers(workers)
        self.limits = limits or Limits()
        self.python = python or default_python()
        self.bwrap = find_bwrap(bwrap)
        self._slots = threading.BoundedSemaphore(self.workers)
        self._executor: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()
        self._checked = False
        self.seccomp = seccomp.program()
        self.cgroup = cgroups.find()
        self.cgroup_reason = cgroups.LAST_REASON
        owner.sweep_dirs()
        if self.cgroup is not None:
            self.cgroup.sweep()

    def check(self) -> None:
        """Start one sandbox (once per pool); :class:`SandboxUnavailable` with the reason when it fails."""
        if self._checked:
            return
        r = self.run("print('ok')")
        if not (r.ok and r.stdout.strip() == "ok"):
            raise SandboxUnavailable(f"the code sandbox does not work on this machine ({self.bwrap} with "
                                     f"{self.python}): {r.verdict}, exit code {r.exit_code}: "
                                     f"{r.stderr_tail or '(no message)'}")
        self._checked = True

    def run(self, code: str, stdin: Text = "", limits: Optional[Limits] = None) -> Result:
        """Run ``code`` (Python source) with ``stdin``; blocks until a slot is free and the program ended."""
        limits = limits or self.limits
        data = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin or b"")
        with self._slots:
            work = tempfile.mkdtemp(prefix=owner.prefix())
            group = None
            try:
                _write_program(work, code)
                if self.cgroup is not None:
                    group = self._group(os.path.basename(work), limits)
                raw = self._launch(work, data, limits, group)
                oom = group.oom_kills() if group is not None else 0
            finally:
                if group is not None:
                    group.remove()
                shutil.rmtree(work, ignore_errors=True)
        if not raw.started:
            raise SandboxUnavailable(f"bwrap could not start the sandbox (exit code {raw.returncode}): "
                                     f"{_tail(raw.stderr) or '(no message)'}")
        return Result(classify(raw, oom), raw.stdout.decode("utf-8", "replace"), _tail(raw.stderr),
                      raw.exit_code if raw.exit_code is not None else raw.returncode, raw.seconds)

    def _group(self, name: str, limits: Limits) -> cgroups.ProgramCgroup:
        try:
            return self.cgroup.create(name, limits.memory_mb)
        except OSError as e:
            raise SandboxUnavailable(f"cannot make the program's memory cgroup in {self.cgroup}: {e}") from None

    def _launch(self, work: str, data: bytes, limits: Limits, group: Optional[cgroups.ProgramCgroup]) -> Raw:
        """bwrap with its status pipe, its seccomp filter (a pipe holding it) and, with a cgroup, the gate."""
        status_r, status_w = os.pipe()
        child_fds, seccomp_fd, gate, block_r = [], None, None, None
        if self.seccomp is not None:
            seccomp_fd, filter_w = os.pipe()
            os.write(filter_w, self.seccomp)
            os.close(filter_w)
            child_fds.append(seccomp_fd)
        if group is not None:
            block_r, block_w = os.pipe()
            child_fds.append(block_r)
            gate = Gate(block_w, lambda pid: self._join(group, pid))
        argv = bwrap_argv(self.bwrap, self.python, work, limits, status_w, seccomp_fd, block_r)
        try:
            return run_process(argv, data, limits.wall_seconds, limits.output_bytes, dict(ENV), run_as(),
                               status_w, status_r, child_fds, gate)
        except OSError as e:       # bwrap itself could not be executed
            raise SandboxUnavailable(f"cannot run {self.bwrap}: {e}") from None

    def _join(self, group: cgroups.ProgramCgroup, pid: int) -> None:
        try:
            group.add(pid)
        except OSError as e:
            raise SandboxUnavailable(f"cannot move the sandbox into its memory cgroup {group.path}: {e}") from None

    def run_many(self, programs: Sequence[tuple[str, Text]], limits: Optional[Limits] = None) -> list[Result]:
        """Run ``[(code, stdin), ...]`` concurrently on the pool's threads; results in the same order."""
        if len(programs) == 1:
            return [self.run(programs[0][0], programs[0][1], limits)]
        futures = [self._pool().submit(self.run, code, stdin, limits) for code, stdin in programs]
        return [f.result() for f in futures]

    async def run_async(self, code: str, stdin: Text = "", limits: Optional[Limits] = None) -> Result:
        """:meth:`run` from an event loop (on a worker thread)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool(), self.run, code, stdin, limits)

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="slick-sandbox")
            return self._executor


def _write_program(work: str, code: str) -> None:
    """``work/main.py``; readable by the sandbox's user (``nobody`` when slick runs as root)."""
    path = os.path.join(work, "main.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(code)
    if os.geteuid() == 0:
        os.chmod(work, 0o755)
        os.chmod(path, 0o644)

"""Child processes that do not outlive the driver, and a driver that shuts down on SIGTERM as on Ctrl-C.

Two mechanisms, both used for every process slick launches (``slick.engines.router._Process``):

* **PR_SET_PDEATHSIG** (Linux): set in the child between fork and exec (:func:`die_with_parent`), so the
  kernel signals the child the moment its parent dies, SIGKILL included. The kernel ties it to the *thread*
  that forked, so it is set only when the launch happens on the main thread (a worker launched from a helper
  thread would otherwise die with that thread).
* **a parent watch** inside the child (:func:`watch_parent`): a daemon thread polls ``os.getppid()`` and, once
  the parent is gone (the child was re-parented), runs the child's own shutdown; if that does not finish
  within a grace period the process exits hard. ``slick serve --parent-pid PID`` starts it; programs that
  cannot take such a flag (the sglang-router) are run through this module, which starts the watch and then
  runs their module in the same process (same pid, same signals)::

      python -m slick.proc --parent-pid PID --module sglang_router.launch_router -- ARGS...

Threads must not keep a finished driver alive either: :class:`DaemonThreadPool` runs synchronous user code
(reward functions) on daemon threads that interpreter exit does not wait for.

For the driver itself, :func:`cancel_on_sigterm` makes SIGTERM cancel the main task, which is what Ctrl-C
does under ``asyncio.run``: every ``finally`` runs (``Run.close``: engines, router, trainer ranks, a Ray
cluster slick started).
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import ctypes
import functools
import logging
import os
import queue
import signal
import sys
import threading
import time
from typing import Callable, Optional

log = logging.getLogger("slick.proc")

PR_SET_PDEATHSIG = 1
# oneDNN's primitive cache capacity as slick's entry points set it (slick.proc.memory.limit_onednn_cache), and
# the variable that marks it as slick's value rather than the user's: engines of other projects keep their own
ONEDNN_CACHE_ENV, ONEDNN_CACHE_ENTRIES, ONEDNN_CACHE_MARK = "ONEDNN_PRIMITIVE_CACHE_CAPACITY", 128, "SLICK_ONEDNN_CACHE"
POLL_S = 0.5


def _prctl_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):   # not Linux
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the kernel send ``sig`` to the child when this
    process dies; None when called off the main thread (see the module docstring) or off Linux."""
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def preexec() -> None:
        _prctl_pdeathsig(sig)
        if os.getppid() != parent:   # the parent died before prctl took effect
            os.kill(os.getpid(), sig)
    return preexec


def watch_parent(parent_pid: int, on_gone: Callable[[], None], grace_s: float = 20.0, what: str = "process",
                 poll_s: float = POLL_S) -> threading.Thread:
    """Start a daemon thread that calls ``on_gone()`` once ``parent_pid`` is no longer this process's parent,
    then ``os._exit(1)`` if the process is still alive ``grace_s`` seconds later."""
    def loop() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        print(f"{what} (pid {os.getpid()}): parent process {parent_pid} is gone; shutting down", file=sys.stderr,
              flush=True)
        try:
            on_gone()
        except Exception as e:  # noqa: BLE001 - the hard exit below still happens
            print(f"{what}: shutdown after the parent died failed: {e}", file=sys.stderr, flush=True)
        time.sleep(grace_s)
        print(f"{what} (pid {os.getpid()}): still running {grace_s:.0f}s after its parent died; exiting",
              file=sys.stderr, flush=True)
        os._exit(1)

    if parent_pid == os.getppid():
        t = threading.Thread(target=loop, name="slick-parent-watch", daemon=True)
        t.start()
        return t
    # already orphaned (the parent died while this process started)
    print(f"{what} (pid {os.getpid()}): parent process {parent_pid} is gone before start; exiting",
          file=sys.stderr, flush=True)
    os._exit(1)


def watch_parent_args(cmd: list[str], module: str) -> list[str]:
    """``cmd`` = ``[python, -m, MODULE, ARGS...]`` rewritten to run under this module's parent watch."""
    if cmd[1:3] != ["-m", module]:
        raise ValueError(f"expected [python, -m, {module}, ...], got {cmd[:3]}")
    return [cmd[0], "-m", "slick.proc", "--parent-pid", str(os.getpid()), "--module", module, "--", *cmd[3:]]


@contextlib.contextmanager
def cancel_on_sigterm(what: str = "slick"):
    """Inside a coroutine: SIGTERM cancels the current task (as SIGINT does under ``asyncio.run``)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def handler() -> None:
        log.warning("%s: SIGTERM received; shutting down (workers, router, Ray cluster, temp dirs)", what)
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGTERM, handler)
    except (NotImplementedError, RuntimeError, ValueError):   # not the main thread, or not Unix
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _label(fn) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    mod, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None) or repr(fn)
    return f"{mod}.{name}" if mod else name


class DaemonThreadPool(concurrent.futures.Executor):
    """A thread pool whose threads never keep the process alive.

    ``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit, so one call that never
    returns (a stuck user reward function) blocks the exit forever. These threads are daemons and are not
    joined: the process exits when the main thread is done. :meth:`running` names the calls still running
    (for a warning). Usable with ``loop.run_in_executor``."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "slick-daemon"):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._max, self._prefix = int(max_workers), thread_name_prefix
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._running: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._prefix}: cannot submit after shutdown")
            f: concurrent.futures.Future = concurrent.futures.Future()
            self._queue.put((f, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max:
                t = threading.Thread(target=self._work, name=f"{self._prefix}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            return f

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            f, fn, args, kwargs = item
            if f.set_running_or_notify_cancel():
                key = id(f)
                with self._lock:
                    self._running[key] = (_label(fn), time.monotonic())
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                    f.set_exception(e)
                else:
                    f.set_result(result)
                finally:
                    with self._lock:
                        self._running.pop(key, None)
            self._idle.release()

    def running(self) -> list[tuple[str, float]]:
        """(function name, seconds it has run) of each call still running."""
        now = time.monotonic()
        with self._lock:
            return [(name, now - t0) for name, t0 in self._running.values()]

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking work; with ``cancel_futures`` queued calls are cancelled; ``wait`` joins the threads
        (a stuck call makes that wait forever: pass ``wait=False`` then)."""
        with self._lock:
            self._shutdown = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._queue.put(None)
        if wait:
            for t in threads:
                t.join()


async def until_sigterm(coro, what: str = "slick"):
    """Await ``coro`` with :func:`cancel_on_sigterm`: SIGTERM raises ``asyncio.CancelledError`` out of
    ``asyncio.run`` after every ``finally`` of ``coro`` has run."""
    with cancel_on_sigterm(what):
        return await coro


def rss_bytes() -> int:
    """Resident memory of this process in bytes (Linux /proc; elsewhere the peak RSS from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource   # Unix only

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def foreign_engine_env(env: dict) -> dict:
    """``env`` for a vLLM or SGLang server: without the oneDNN cache capacity when slick set it (the user's own
    value stays), so those engines keep oneDNN's default for their own shapes."""
    env = dict(env)
    if env.pop(ONEDNN_CACHE_MARK, None) == env.get(ONEDNN_CACHE_ENV):
        env.pop(ONEDNN_CACHE_ENV, None)
    return env


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m slick.proc --parent-pid PID --module MOD -- ARGS``: run ``MOD`` as ``__main__`` with ARGS,
    in this process, and shut it down (SIGTERM, then a hard exit) when PID stops being its parent."""
    import runpy

    argv = sys.argv[1:] if argv is None else argv
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m slick.proc", description=main.__doc__)
    p.add_argument("--parent-pid", type=int, required=True, help="Exit when this process is no longer the parent.")
    p.add_argument("--module", required=True, help="Python module to run as __main__ (e.g. sglang_router.launch_router).")
    p.add_argument("--grace-s", type=float, default=5.0, help="Seconds between SIGTERM and the hard exit.")
    args = p.parse_args(argv)
    watch_parent(args.parent_pid, lambda: os.kill(os.getpid(), signal.SIGTERM), grace_s=args.grace_s,
                 what=args.module)
    sys.argv = [args.module, *rest]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)
    return 0

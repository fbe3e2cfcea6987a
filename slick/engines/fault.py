"""Engine faults: the error a dead engine raises, partial generations that survive a worker, and recovery.

* :class:`EngineDied` ends a run whose engine died without ``--use-fault-tolerance``; its message names the
  worker URL, its pid and exit signal, and the samples that were pending.
* :class:`PartialGeneration` gathers the tokens, logprobs and per-token weight versions of one generation
  over several requests (a request moved to another worker, or resubmitted after a weight update, continues
  as prompt + tokens so far with the tokens it has left).
* :class:`Recovery` (``--use-fault-tolerance``): a failed worker leaves the router and the client's URL list
  at once, the requests it was serving are handed to the healthy workers, and a replacement is started,
  brought to the engines' weights and version by the run's ``bring_up(url)``, its version checked with
  ``/get_weight_version``, and only then added to the router and the URL list.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
from typing import Awaitable, Callable, Optional

from slick.types import Generation, SamplingParams

log = logging.getLogger("slick.engine")


class EngineDied(RuntimeError):
    """An engine worker died or hung and the run cannot go on (no --use-fault-tolerance, or nothing left)."""

    def __init__(self, message: str, url: str = "", pid: Optional[int] = None):
        super().__init__(message)
        self.url, self.pid = url, pid


def exit_description(returncode: Optional[int]) -> str:
    """'killed by SIGKILL', 'exited with code 3', or 'still running'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class PartialGeneration:
    """Tokens, logprobs, per-token versions and top logprobs (while every part has them) of one generation,
    gathered over several requests."""

    def __init__(self):
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.tops: Optional[list] = []     # None once tokens came without their top logprobs

    def add(self, gen: Generation) -> None:
        if gen.token_ids:
            self.tops = None if self.tops is None or gen.top_logprobs is None else self.tops + list(gen.top_logprobs)
        self.tokens += gen.token_ids
        self.logprobs += gen.logprobs
        self.versions += gen.weight_versions if gen.weight_versions is not None \
            else [gen.weight_version] * len(gen.token_ids)

    def add_tokens(self, tokens: list[int], logprobs: list[float], versions: list[int],
                   sampling: Optional[SamplingParams] = None) -> None:
        """Tokens a failed attempt streamed, kept for the next attempt to continue from; none when ``sampling``
        constrains the answer (``json_schema`` / ``regex`` / ``ebnf``): a server matches a request's grammar
        from the start of its answer, so after the kept tokens it would allow a whole new answer. A constrained
        generation starts over instead."""
        if sampling is not None and any(getattr(sampling, f) is not None for f in ("json_schema", "regex", "ebnf")):
            return
        if tokens:
            self.tops = None
        self.tokens += tokens
        self.logprobs += logprobs
        self.versions += versions

    def prompt(self, prompt_ids: list[int]) -> list[int]:
        """What the next request sends: the prompt plus the tokens so far."""
        return list(prompt_ids) + self.tokens

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        """``sampling`` with the new tokens it has left (at least 1)."""
        if not self.tokens:
            return sampling
        return dataclasses.replace(sampling, max_new_tokens=max(sampling.max_new_tokens - len(self.tokens), 1))

    def left(self, sampling: SamplingParams) -> int:
        return sampling.max_new_tokens - len(self.tokens)

    def result(self, last: Generation, prompt_len: int) -> Generation:
        """The whole generation, once ``last`` (already added) finished it."""
        tops = self.tops if self.tops is not None and (self.tokens or last.top_logprobs is not None) else None
        return Generation(token_ids=list(self.tokens), logprobs=list(self.logprobs), finish_reason=last.finish_reason,
                          weight_version=last.weight_version, prompt_tokens=prompt_len,
                          weight_versions=list(self.versions), top_logprobs=None if tops is None else list(tops),
                          routed_experts=last.routed_experts)   # its prompt held every earlier token (docs/moe.md)


class Recovery:
    """Replace failed workers of an :class:`~slick.engines.client.HttpEngine` (module doc).

    ``workers``: URL -> the worker's process handle (``alive``, ``kill``, ``stop``, ``pid``); ``relaunch(url)``
    (blocking, bounded by its own start-up timeout) starts the replacement of ``url`` (a new `slick serve`
    process, or a restarted Ray engine actor) and returns its handle; ``router``:
    the RouterProcess in front, or None; ``bring_up(url)`` loads the engines' current weights and version into
    the worker at ``url`` and returns that version; ``weights_lock`` is held by the run's weight syncs, so a
    replacement joins either before a sync (and gets it) or after (and was brought to it).
    """

    def __init__(self, engine, workers: dict, relaunch: Callable[[str], object], *, router=None,
                 bring_up: Optional[Callable[[str], Awaitable[int]]] = None, weights_lock: Optional[asyncio.Lock] = None,
                 on_fatal: Optional[Callable[[EngineDied], None]] = None, timeout: float = 60.0):
        self.engine, self.workers, self.relaunch, self.router = engine, workers, relaunch, router
        self.bring_up, self.on_fatal, self.timeout = bring_up, on_fatal, float(timeout)
        self.weights_lock = weights_lock or asyncio.Lock()
        self.deaths = self.restarts = 0
        self.recovery_time = 0.0         # seconds from detection to the replacement rejoining (last recovery)
        self.started: list = []          # replacement processes (the run stops them at the end)
        self.errors: list[str] = []
        self.events: list[tuple[float, str, str]] = []   # (time.time() of detection, url, reason)
        self._handling: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._launch_lock, self._closed = threading.Lock(), False

    def metrics(self) -> dict:
        return {"fault/engine_deaths": float(self.deaths), "fault/engine_restarts": float(self.restarts),
                "fault/requests_resubmitted": float(getattr(self.engine, "resubmitted", 0)),
                "fault/recovery_time": float(self.recovery_time)}

    def busy(self) -> bool:
        return bool(self._handling)

    async def failed(self, url: str, reason: str) -> None:
        """Worker ``url`` failed (``reason``): take it out now, hand its requests on, start the replacement
        in the background."""
        if url in self._handling:
            return
        self._handling.add(url)
        self.events.append((time.time(), url, reason))
        self.deaths += 1
        t0 = time.monotonic()
        log.warning("engine worker %s failed (%s): removing it and starting a replacement", url, reason)
        self.engine.remove_worker(url)
        if self.router is not None:
            try:
                await _bounded(asyncio.to_thread(self.router.remove_worker, url, self.timeout), self.timeout + 5,
                               f"router {self.router.url}: removing {url}")
            except (KeyError, TimeoutError, RuntimeError, OSError) as e:
                log.warning("router: could not remove %s: %s", url, e)
        await self.engine.lose_worker(url)
        proc = self.workers.pop(url, None)
        if not self.engine.control_urls and self.on_fatal is not None:
            self.on_fatal(EngineDied(f"engine worker {url} failed ({reason}) and no healthy worker is left; "
                                     f"a replacement is starting but the run cannot wait without engines", url,
                                     getattr(proc, "pid", None)))
        task = asyncio.ensure_future(self._replace(url, proc, t0))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replace(self, url: str, proc, t0: float) -> None:
        try:
            if proc is not None:
                await asyncio.to_thread(_kill, proc)
            new = await asyncio.to_thread(self._launch, url)
            try:
                async with self.weights_lock:
                    want = await self.bring_up(new.url) if self.bring_up is not None else None
                    got = await self.engine.weight_version_of(new.url)
                    if want is not None and got != want:
                        raise EngineDied(f"replacement worker {new.url} reports weight version {got}, the engines "
                                         f"are at {want}: it is not used", new.url, new.pid)
                    if self.router is not None:
                        await _bounded(asyncio.to_thread(self.router.add_worker, new.url, self.timeout),
                                       self.timeout + 5, f"router {self.router.url}: adding {new.url}")
                    self.engine.add_worker(new.url)
            except BaseException:
                await asyncio.to_thread(new.stop, 5.0)
                raise
            self.workers[new.url] = new
            self.restarts += 1
            self.recovery_time = time.monotonic() - t0
            log.warning("engine worker %s replaced by %s (pid %s, weight version %s) in %.1fs", url, new.url,
                        new.pid, got, self.recovery_time)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the run goes on with the workers it has
            msg = f"could not replace engine worker {url}: {type(e).__name__}: {e}"
            self.errors.append(msg)
            log.error("%s", msg)
            if not self.engine.control_urls and self.on_fatal is not None:
                self.on_fatal(EngineDied(msg + " (no healthy worker is left)", url))
        finally:
            self._handling.discard(url)

    async def wait_idle(self, timeout: float) -> None:
        """Wait for replacements under way (at most ``timeout`` seconds; TimeoutError names them)."""
        if not self._tasks:
            return
        done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        if pending:
            raise TimeoutError(f"engine replacement for {sorted(self._handling)} not done within {timeout:g}s")

    def _launch(self, url: str):
        """Start a replacement (on a worker thread) and record it in ``started``; one that finishes starting after
        :meth:`close` is stopped here, since nothing else would stop it (a cancelled task cannot stop its thread)."""
        new = self.relaunch(url)
        with self._launch_lock:
            if not self._closed:
                self.started.append(new)
                return new
        new.stop(5.0)
        raise RuntimeError(f"replacement {getattr(new, 'url', new)} for {url} started after the run closed; stopped")

    async def close(self) -> None:
        with self._launch_lock:
            self._closed = True
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _bounded(aw, seconds: float, what: str):
    try:
        return await asyncio.wait_for(aw, seconds)
    except asyncio.TimeoutError:
        raise TimeoutError(f"{what}: not done within {seconds:g}s") from None


def _kill(proc) -> None:
    """SIGCONT (a stopped process cannot act on SIGTERM) then SIGKILL, and reap."""
    p = getattr(proc, "proc", None)
    if p is not None and p.poll() is None:
        try:
            p.send_signal(signal.SIGCONT)
        except ProcessLookupError:
            pass
    proc.kill()
    if hasattr(proc, "stop"):
        proc.stop(timeout=5)

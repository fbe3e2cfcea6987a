"""The reward hub: scores groups of samples with built-in, remote or user reward functions.

One object, built from the run's config, used by the rollout manager::

    hub = RewardHub(cfg)
    await hub.score_group(group)   # sets sample.reward on each sample; never raises
    hub.scalar(sample)             # float reward (dict rewards: cfg.reward_key)
    hub.stats()                    # {"reward/failures": n, "reward/timeouts": n, ...}
    await hub.close()

Which function scores a sample: ``--custom-rm-path`` when given (with ``--group-rm`` it is
called once per group), else ``sample.metadata["rm_type"]`` when present, else ``--rm-type``.
At most ``--rm-concurrency`` calls run at once; synchronous functions run on the hub's own
worker threads so the event loop stays free; each call gets ``--rm-timeout`` seconds (a remote
call gets that per attempt, retries included in its own bound). A call that raises, times out
or returns something that is not a finite number or a dict gives its sample(s)
``--rm-failure-reward``, sets ``sample.metadata["reward_error"]``, is counted in
:meth:`RewardHub.stats` and logged as a warning; the other samples are unaffected.

A timed-out synchronous function cannot be killed: its worker thread stays busy until the
function returns (the result is then dropped).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import numbers
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Union

from slick.reward.custom import load_function
from slick.reward.registry import REMOTE, get_score_fn
from slick.reward.remote import RemoteRewardError, RemoteRM

logger = logging.getLogger(__name__)

Reward = Union[float, dict]


def check_reward(value: Any) -> Reward:
    """Normalise a reward function's result to a float or a dict; ``ValueError`` otherwise.

    Booleans and numeric scalars (Python, NumPy, 0-d tensors) become floats; NaN and infinities
    are rejected, because one of them would poison a whole training batch.
    """
    if isinstance(value, dict):
        return value
    if isinstance(value, numbers.Real) or (hasattr(value, "item") and hasattr(value, "__float__")):
        out = float(value)
        if not math.isfinite(out):
            raise ValueError(f"reward is not finite ({out})")
        return out
    raise ValueError(f"reward must be a number or a dict, got {type(value).__name__}: {str(value)[:80]!r}")


class RewardHub:
    """Scores samples as configured by ``cfg`` (see the module docstring for the rules).

    Construction checks the configuration: a bad ``--custom-rm-path`` or an unknown
    ``--rm-type`` raises ``ValueError`` here rather than at the first call.
    ``remote_backoff`` is the first retry delay of remote calls, in seconds (doubles each try).
    """

    def __init__(self, cfg: Any, *, remote_backoff: float = 0.5):
        self.cfg = cfg
        self.rm_type: Optional[str] = cfg.rm_type
        self.group_rm = bool(cfg.group_rm)
        self.timeout: Optional[float] = cfg.rm_timeout if cfg.rm_timeout and cfg.rm_timeout > 0 else None
        self.failure_reward = float(cfg.rm_failure_reward)
        self.concurrency = max(1, int(cfg.rm_concurrency))
        self.custom_fn: Optional[Callable] = None
        if cfg.custom_rm_path:
            self.custom_fn = load_function(cfg.custom_rm_path, "--custom-rm-path")
        elif not self.rm_type:
            raise ValueError("no reward configured: set --rm-type or --custom-rm-path")
        elif self.rm_type == REMOTE:
            if not cfg.rm_url:
                raise ValueError("--rm-type remote_rm needs --rm-url")
        else:
            get_score_fn(self.rm_type)           # raises ValueError naming the unknown type
        self._remote: Optional[RemoteRM] = None
        if cfg.rm_url:
            self._remote = RemoteRM(cfg.rm_url, timeout=self.timeout or 300.0,
                                    max_retries=cfg.rm_max_retries, backoff=remote_backoff,
                                    max_connections=self.concurrency)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._sem_loop: Optional[asyncio.AbstractEventLoop] = None
        self._counts = {"samples": 0, "calls": 0, "failures": 0, "timeouts": 0}
        self._time_total = 0.0

    # ------------------------------------------------------------------ public API
    async def score_group(self, group: list) -> None:
        """Set ``reward`` on every sample of ``group``. Never raises (except on cancellation)."""
        group = list(group)
        t0 = time.perf_counter()
        try:
            if self.custom_fn is not None and self.group_rm:
                await self._score_group_once(group)
            else:
                await asyncio.gather(*(self._score_one(s) for s in group))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - last resort: the contract is "never raises"
            for s in group:
                if s.reward is None:
                    self._fail(s, f"internal error: {type(e).__name__}: {e}")
        finally:
            self._counts["samples"] += len(group)
            self._time_total += time.perf_counter() - t0

    def scalar(self, sample: Any) -> float:
        """The sample's reward as a float; dict rewards use ``cfg.reward_key``.

        Without ``--reward-key`` a dict reward falls back to its ``"reward"`` entry.
        Raises ``ValueError`` for an unscored sample and ``KeyError`` naming the available keys
        when the key is missing.
        """
        r = sample.reward
        if r is None:
            raise ValueError(f"sample {sample.index} has no reward yet (score it with RewardHub.score_group)")
        if isinstance(r, dict):
            key = self.cfg.reward_key or ("reward" if "reward" in r else None)
            if key is None:
                raise KeyError(f"sample {sample.index} has a dict reward with keys {sorted(r)}; "
                               f"set --reward-key to choose the scalar")
            if key not in r:
                raise KeyError(f"--reward-key {key!r} not in the dict reward of sample {sample.index} "
                               f"(keys: {sorted(r)})")
            return float(r[key])
        return float(r)

    def stats(self) -> dict:
        """Counters since the hub was built: samples scored, function calls, failures, timeouts,
        remote retries, and total wall time spent in :meth:`score_group` (seconds)."""
        out = {f"reward/{k}": v for k, v in self._counts.items()}
        out["reward/retries"] = self._remote.retries if self._remote else 0
        out["reward/time_total_s"] = self._time_total
        return out

    async def close(self) -> None:
        """Close HTTP sessions and release worker threads (the hub reopens them if used again)."""
        if self._remote is not None:
            await self._remote.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ------------------------------------------------------------------ internals
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.concurrency), loop
        return self._sem

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="slick-reward")
        return self._pool

    async def _call(self, fn: Callable, *args: Any) -> Any:
        """Run ``fn(*args)``: awaited if async, on a worker thread if sync."""
        self._counts["calls"] += 1
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        result = await asyncio.get_running_loop().run_in_executor(self._executor(), functools.partial(fn, *args))
        if inspect.isawaitable(result):       # a sync wrapper that returned a coroutine
            result = await result
        return result

    def _rm_type_of(self, sample: Any) -> str:
        meta = sample.metadata if isinstance(sample.metadata, dict) else {}
        return meta.get("rm_type") or self.rm_type

    async def _reward_of(self, sample: Any) -> tuple[Any, Optional[float]]:
        """(awaitable producing the raw reward, timeout to apply) for one sample."""
        if self.custom_fn is not None:
            return self._call(self.custom_fn, self.cfg, sample), self.timeout
        rm_type = self._rm_type_of(sample)
        if rm_type == REMOTE:
            if self._remote is None:
                raise ValueError("rm_type remote_rm needs --rm-url")
            self._counts["calls"] += 1
            # the remote client bounds each attempt itself; the outer bound covers all retries
            return (self._remote.score(sample.prompt, sample.response or "", sample.label),
                    self._remote.worst_case_seconds() + 1.0)
        fn = get_score_fn(rm_type)
        meta = sample.metadata if isinstance(sample.metadata, dict) else {}
        return self._call(fn, sample.response or "", sample.label, meta), self.timeout

    async def _score_one(self, sample: Any) -> None:
        sample.reward = None
        try:
            async with self._semaphore():
                t0 = time.perf_counter()
                awaitable, timeout = await self._reward_of(sample)
                reward = check_reward(await asyncio.wait_for(awaitable, timeout))
                sample.timings["reward_time"] = time.perf_counter() - t0
            self._succeed(sample, reward)
        except asyncio.TimeoutError:
            self._fail(sample, f"timed out after {self.timeout}s", timed_out=True)
        except RemoteRewardError as e:
            self._fail(sample, str(e), timed_out=e.timed_out)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's reward function may raise anything
            self._fail(sample, f"{type(e).__name__}: {e}")

    async def _score_group_once(self, group: list) -> None:
        for s in group:
            s.reward = None
        try:
            async with self._semaphore():
                rewards = await asyncio.wait_for(self._call(self.custom_fn, self.cfg, group), self.timeout)
        except asyncio.TimeoutError:
            for s in group:
                self._fail(s, f"group reward timed out after {self.timeout}s", timed_out=True)
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            for s in group:
                self._fail(s, f"group reward raised {type(e).__name__}: {e}")
            return
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(group):
            got = f"{type(rewards).__name__} of length {len(rewards)}" if hasattr(rewards, "__len__") \
                else type(rewards).__name__
            for s in group:
                self._fail(s, f"group reward must return a list of {len(group)} rewards, got {got}")
            return
        for s, r in zip(group, rewards):
            try:
                self._succeed(s, check_reward(r))
            except Exception as e:  # noqa: BLE001 - e.g. float() of a multi-element tensor
                self._fail(s, f"{type(e).__name__}: {e}")

    def _succeed(self, sample: Any, reward: Reward) -> None:
        sample.reward = reward
        if isinstance(sample.metadata, dict):
            sample.metadata.pop("reward_error", None)

    def _fail(self, sample: Any, message: str, timed_out: bool = False) -> None:
        sample.reward = self.failure_reward
        if not isinstance(sample.metadata, dict):
            sample.metadata = {}
        sample.metadata["reward_error"] = message
        self._counts["failures"] += 1
        if timed_out:
            self._counts["timeouts"] += 1
        logger.warning("reward failed for sample %s (group %s): %s; using reward %g",
                       getattr(sample, "index", "?"), getattr(sample, "group_index", "?"),
                       message, self.failure_reward)

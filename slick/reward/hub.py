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
or returns something that is not a finite number or a dict (checked below) gives its sample(s)
``--rm-failure-reward``, sets ``sample.metadata["reward_error"]``, is counted in
:meth:`RewardHub.stats` and logged as a warning; the other samples are unaffected.

A dict reward is checked when it arrives: its scalar (``--reward-key``, else ``"reward"``, see
:mod:`slick.reward.scalar`) must be present and a finite number, or the sample fails as above, so
no NaN/inf ever reaches training. Other non-finite numeric fields of a kept dict are reported
(``sample.metadata["reward_warning"]``, ``reward/nonfinite_fields``) but do not fail the sample.
Non-finite scalars count in ``reward/nonfinite`` and unusable labels
(:class:`~slick.reward.errors.LabelError`) in ``reward/bad_labels``, both also in ``reward/failures``.

Every scored sample also gets ``sample.evidence`` (:mod:`slick.reward.evidence`): the reward type, the
extracted answer, the verdict, the error when it failed and the seconds the verifier took, plus
reward-type extras. ``on_scored`` (a constructor argument) is called with each sample right after it got its reward and
evidence (the Prometheus exporter counts latencies and failures per reward type with it).

A timed-out synchronous function cannot be killed: its worker thread stays busy until the
function returns (the result is then dropped).
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Union

from slick.compat.view import is_slime_plugin, prompt_text, slime_prompt, to_slime
from slick.config import Config
from slick.plugins import load_function
from slick.proc.children import DaemonThreadPool
from slick.reward.errors import LabelError, NonFiniteRewardError
from slick.reward.evidence import Judgement, make_evidence, reply_evidence
from slick.reward.registry import REMOTE, get_judge_fn, get_score_fn
from slick.reward.remote import RemoteRewardError, RemoteRM
from slick.reward.scalar import finite_float, is_number, nonfinite_fields, scalar_reward

logger = logging.getLogger(__name__)

Reward = Union[float, dict]


def check_reward(value: Any, reward_key: Optional[str] = None, index: Any = None) -> Reward:
    """Normalise a reward function's result to a float or a dict; ``ValueError`` otherwise.

    Booleans and numeric scalars (Python, NumPy, 0-d tensors) become floats; NaN and infinities
    are rejected (:class:`NonFiniteRewardError`), because one of them would poison a whole
    training batch. A dict is returned as is once its scalar (``reward_key``, else ``"reward"``)
    is found to be a finite number (``KeyError`` when it is missing). ``index`` names the sample
    in messages.
    """
    if isinstance(value, (list, tuple)) and not isinstance(value, str):
        # one reward per policy turn (slick.algo.turns): kept as {"reward": sum, "turn_rewards": [...]}
        if not value:
            raise ValueError("a per-turn reward list is empty: give one reward per policy turn")
        turns = [finite_float(v, f"per-turn reward {i}") for i, v in enumerate(value)]
        return {"reward": sum(turns), "turn_rewards": turns}
    if isinstance(value, dict):
        scalar_reward(value, reward_key, index)
        return value
    if is_number(value):
        return finite_float(value, "reward")
    raise ValueError(f"reward must be a number or a dict (or a list, one per policy turn), got "
                     f"{type(value).__name__}: {str(value)[:80]!r}")


def check_turn_count(reward: Reward, sample: Any) -> Reward:
    """A per-turn reward list must have one reward per policy turn of ``sample`` (its runs of loss-mask-1 tokens,
    as slick.algo.turns counts them); ``ValueError`` otherwise, so that the sample fails here, not training."""
    if not isinstance(reward, dict) or "turn_rewards" not in reward:
        return reward
    mask = list(getattr(sample, "loss_mask", None) or [])
    turns = sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1]))
    if mask and turns and len(reward["turn_rewards"]) != turns:
        raise ValueError(f"{len(reward['turn_rewards'])} per-turn rewards for {turns} policy turn(s): give one "
                         f"reward per turn")
    return reward


def rm_concurrency(cfg: Config) -> int:
    """--rm-concurrency, or when unset: --rollout-concurrency for remote_rm (calls that wait on a server; as many
    as the engine may have requests in flight, so reward waits never throttle generation), else 16 (reward
    functions run on that many worker threads)."""
    if cfg.rm_concurrency is not None:
        return int(cfg.rm_concurrency)
    remote = cfg.rm_type == REMOTE and not cfg.custom_rm_path
    return int(cfg.rollout_concurrency or 256) if remote else 16


def _describe(e: BaseException) -> str:
    # str(KeyError("x")) is "'x'"; show our KeyError messages without the extra quotes
    text = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else e
    return f"{type(e).__name__}: {text}"


class RewardHub:
    """Scores samples as configured by ``cfg`` (see the module docstring for the rules).

    Construction checks the configuration: a bad ``--custom-rm-path`` or an unknown
    ``--rm-type`` raises ``ValueError`` here rather than at the first call.
    ``remote_backoff`` is the first retry delay of remote calls, in seconds (doubles each try).
    ``on_scored`` is called with each sample right after it got its reward (the run's Prometheus events).
    """

    def __init__(self, cfg: Config, *, remote_backoff: float = 0.5,
                 on_scored: Optional[Callable[[Any], None]] = None):
        self.cfg = cfg
        self.rm_type: Optional[str] = cfg.rm_type
        self.group_rm = bool(cfg.group_rm)
        self.timeout: Optional[float] = cfg.rm_timeout if cfg.rm_timeout and cfg.rm_timeout > 0 else None
        self.failure_reward = float(cfg.rm_failure_reward)
        self.concurrency = max(1, int(rm_concurrency(cfg)))
        self.custom_fn: Optional[Callable] = None
        self._view: Callable = lambda s: s      # what the custom function receives for a sample
        if cfg.custom_rm_path:
            self.custom_fn = load_function(cfg.custom_rm_path, "--custom-rm-path")
            if is_slime_plugin(self.custom_fn):   # written against slime: it gets slime's Sample (slick/compat)
                self._view = lambda s: to_slime(s, prompt_text(s))
        elif not self.rm_type:
            raise ValueError("no reward configured: set --rm-type or --custom-rm-path")
        elif self.rm_type == REMOTE:
            if not cfg.rm_url:
                raise ValueError("--rm-type remote_rm needs --rm-url")
        else:
            get_score_fn(self.rm_type)           # raises ValueError naming the unknown type
        self._slime = self.custom_fn is not None and is_slime_plugin(self.custom_fn)
        self._judges: dict = {}                  # rm_type -> verifier built for this run (get_judge_fn with cfg)
        if self.rm_type and self.rm_type != REMOTE and self.custom_fn is None:
            self._judge(self.rm_type)            # e.g. code: its sandbox is checked now, not at the first sample
        self._remote: Optional[RemoteRM] = None
        if cfg.rm_url:
            self._remote = RemoteRM(cfg.rm_url, timeout=self.timeout or 300.0,
                                    max_retries=cfg.rm_max_retries, backoff=remote_backoff,
                                    max_connections=self.concurrency)
        self._pool: Optional[ThreadPoolExecutor] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._sem_loop: Optional[asyncio.AbstractEventLoop] = None
        self._counts = {"samples": 0, "calls": 0, "failures": 0, "timeouts": 0,
                        "nonfinite": 0, "bad_labels": 0, "nonfinite_fields": 0}
        self._time_total = 0.0
        self.on_scored = on_scored   # called with each scored sample

    # ------------------------------------------------------------------ public API
    def use_tokenizer(self, tokenizer, apply_chat_template: bool) -> None:
        """Give a slime reward plug-in ``sample.prompt`` as slime does (``slick.compat.view.slime_prompt``: the
        chat-templated text under --apply-chat-template); without a tokenizer it sees the joined contents."""
        if self._slime:
            decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)   # noqa: E731
            self._view = lambda s: to_slime(s, slime_prompt(s, decode, apply_chat_template))

    @property
    def per_sample(self) -> bool:
        """Whether each sample is scored on its own (it can be scored the moment it finishes), i.e. no --group-rm."""
        return not (self.custom_fn is not None and self.group_rm)

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
        """The sample's reward as a float: :func:`slick.reward.scalar.scalar_reward` with ``cfg.reward_key``.

        Without ``--reward-key`` a dict reward falls back to its ``"reward"`` entry.
        Raises ``ValueError`` for an unscored sample or a non-finite/non-numeric value and
        ``KeyError`` naming the available keys when the key is missing (samples scored by this
        hub have already passed these checks).
        """
        return scalar_reward(sample.reward, self.cfg.reward_key, getattr(sample, "index", None))

    def stats(self) -> dict:
        """Counters since the hub was built: samples scored, function calls, failures (and among
        them timeouts, non-finite scalars and bad labels), kept dict rewards with other non-finite
        fields, remote retries, and total wall time spent in :meth:`score_group` (seconds)."""
        out = {f"reward/{k}": v for k, v in self._counts.items()}
        out["reward/retries"] = self._remote.retries if self._remote else 0
        out.update(self._remote.stats() if self._remote else {})   # remote outages (slick.reward.remote)
        out["reward/time_total_s"] = self._time_total
        return out

    async def close(self) -> None:
        """Close HTTP sessions and release worker threads (the hub reopens them if used again)."""
        if self._remote is not None:
            await self._remote.close()
        if self._pool is not None:
            for name, seconds in getattr(self._pool, "running", list)():
                logger.warning("reward function %s is still running (for %.0fs, past --rm-timeout); it cannot be "
                               "stopped and will not delay the exit", name, seconds)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # ------------------------------------------------------------------ internals
    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem, self._sem_loop = asyncio.Semaphore(self.concurrency), loop
        return self._sem

    def _executor(self):
        """Daemon threads: a synchronous function that never returns cannot keep a finished run alive."""
        if self._pool is None:
            self._pool = DaemonThreadPool(max_workers=self.concurrency, thread_name_prefix="slick-reward")
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

    def _judge(self, rm_type: str) -> Callable:
        if rm_type not in self._judges:
            self._judges[rm_type] = get_judge_fn(rm_type, self.cfg)
        return self._judges[rm_type]

    def _rm_type_of(self, sample: Any) -> str:
        meta = sample.metadata if isinstance(sample.metadata, dict) else {}
        return meta.get("rm_type") or self.rm_type

    def _evidence_type(self, sample: Any) -> str:
        return "custom" if self.custom_fn is not None else str(self._rm_type_of(sample))

    def _reply_evidence(self, sample: Any, reply: Any, seconds: float) -> dict:
        kind = self._evidence_type(sample)
        extras = {"function": self.cfg.custom_rm_path} if kind == "custom" else {}
        return reply_evidence(kind, reply, seconds, base=_own_evidence(sample), **extras)

    async def _reward_of(self, sample: Any) -> tuple[Any, Optional[float]]:
        """(awaitable producing the raw reward, timeout to apply) for one sample."""
        if self.custom_fn is not None:
            return self._call(self.custom_fn, self.cfg, self._view(sample)), self.timeout
        rm_type = self._rm_type_of(sample)
        if rm_type == REMOTE:
            if self._remote is None:
                raise ValueError("rm_type remote_rm needs --rm-url")
            self._counts["calls"] += 1
            # the remote client bounds each attempt itself; the outer bound covers all retries
            return (self._remote.score(sample.prompt, sample.response or "", sample.label),
                    self._remote.worst_case_seconds() + 1.0)
        fn = self._judge(rm_type)      # the rule verifier with its evidence (a Judgement)
        meta = sample.metadata if isinstance(sample.metadata, dict) else {}
        return self._call(fn, sample.response or "", sample.label, meta), self.timeout

    async def _score_one(self, sample: Any) -> None:
        sample.reward = None
        sample.evidence = {}          # a custom function may write its own entries here
        t0 = None
        raw: Any = None
        try:
            async with self._semaphore():
                t0 = time.perf_counter()
                awaitable, timeout = await self._reward_of(sample)
                raw = await asyncio.wait_for(awaitable, timeout)
                value = raw.score if isinstance(raw, Judgement) else raw
                reward = check_turn_count(check_reward(value, self.cfg.reward_key, getattr(sample, "index", None)),
                                          sample)
                seconds = sample.timings["reward_time"] = time.perf_counter() - t0
            if isinstance(raw, Judgement):
                evidence = make_evidence(self._evidence_type(sample), answer=raw.answer, verdict=raw.verdict,
                                         seconds=seconds, extras=raw.extras)
            else:
                evidence = self._reply_evidence(sample, raw, seconds)
            self._succeed(sample, reward, evidence)
        except asyncio.TimeoutError:
            self._fail(sample, f"timed out after {self.timeout}s", timed_out=True, t0=t0)
        except RemoteRewardError as e:
            self._fail(sample, str(e), timed_out=e.timed_out, t0=t0)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a user's reward function may raise anything
            self._fail(sample, _describe(e), cause=e, t0=t0, reply=raw)

    async def _score_group_once(self, group: list) -> None:
        for s in group:
            s.reward = None
            s.evidence = {}
        t0 = None
        try:
            async with self._semaphore():
                t0 = time.perf_counter()
                rewards = await asyncio.wait_for(self._call(self.custom_fn, self.cfg, [self._view(s) for s in group]),
                                                 self.timeout)
        except asyncio.TimeoutError:
            for s in group:
                self._fail(s, f"group reward timed out after {self.timeout}s", timed_out=True, t0=t0)
            return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001
            for s in group:
                self._fail(s, f"group reward raised {_describe(e)}", cause=e, t0=t0)
            return
        seconds = time.perf_counter() - t0
        if not isinstance(rewards, (list, tuple)) or len(rewards) != len(group):
            got = f"{type(rewards).__name__} of length {len(rewards)}" if hasattr(rewards, "__len__") \
                else type(rewards).__name__
            for s in group:
                self._fail(s, f"group reward must return a list of {len(group)} rewards, got {got}", t0=t0)
            return
        for s, r in zip(group, rewards):
            try:
                reward = check_turn_count(check_reward(r, self.cfg.reward_key, getattr(s, "index", None)), s)
            except Exception as e:  # noqa: BLE001 - e.g. float() of a multi-element tensor
                self._fail(s, _describe(e), cause=e, t0=t0, reply=r)
                continue
            self._succeed(s, reward, self._reply_evidence(s, r, seconds))

    def _succeed(self, sample: Any, reward: Reward, evidence: Optional[dict] = None) -> None:
        sample.reward = reward
        sample.evidence = evidence if evidence is not None else \
            make_evidence(self._evidence_type(sample), base=_own_evidence(sample))
        if not isinstance(sample.metadata, dict):
            sample.metadata = {}
        sample.metadata.pop("reward_error", None)
        sample.metadata.pop("reward_warning", None)
        bad = nonfinite_fields(reward) if isinstance(reward, dict) else {}
        if bad:
            message = "non-finite dict reward fields (not used for training): " + \
                ", ".join(f"{k!r}={v}" for k, v in bad.items())
            sample.metadata["reward_warning"] = message
            self._counts["nonfinite_fields"] += 1
            logger.warning("reward of sample %s (group %s): %s", getattr(sample, "index", "?"),
                           getattr(sample, "group_index", "?"), message)
        self._notify(sample)

    def _notify(self, sample: Any) -> None:
        if self.on_scored is not None:
            try:
                self.on_scored(sample)
            except Exception:  # noqa: BLE001 - metrics must never fail scoring
                logger.exception("reward observer failed for sample %s", getattr(sample, "index", "?"))

    def _fail(self, sample: Any, message: str, timed_out: bool = False,
              cause: Optional[BaseException] = None, t0: Optional[float] = None, reply: Any = None) -> None:
        sample.reward = self.failure_reward
        seconds = time.perf_counter() - t0 if t0 is not None else 0.0
        extras = {"reply": reply} if reply is not None and not isinstance(reply, Judgement) else {}
        if self.custom_fn is not None:
            extras["function"] = self.cfg.custom_rm_path
        sample.evidence = make_evidence(self._evidence_type(sample), error=message, seconds=seconds,
                                        extras=extras, base=_own_evidence(sample))
        if not isinstance(sample.metadata, dict):
            sample.metadata = {}
        sample.metadata.pop("reward_warning", None)
        sample.metadata["reward_error"] = message
        self._counts["failures"] += 1
        if timed_out:
            self._counts["timeouts"] += 1
        if isinstance(cause, NonFiniteRewardError):
            self._counts["nonfinite"] += 1
        elif isinstance(cause, LabelError):
            self._counts["bad_labels"] += 1
        logger.warning("reward failed for sample %s (group %s): %s; using reward %g",
                       getattr(sample, "index", "?"), getattr(sample, "group_index", "?"),
                       message, self.failure_reward)
        self._notify(sample)


def _own_evidence(sample: Any) -> dict:
    """Entries a custom reward function wrote into ``sample.evidence`` while it ran."""
    ev = getattr(sample, "evidence", None)
    return dict(ev) if isinstance(ev, dict) else {}

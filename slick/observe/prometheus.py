"""Prometheus exporter of a training run (``--prometheus-port`` on `slick train` / `slick train-async`).

One HTTP endpoint, ``GET http://HOST:PORT/metrics``, served from a daemon thread of the driver process by
``prometheus_client``. Every number of the run reaches it:

- **step metrics**: every numeric entry of the step's metrics.jsonl row becomes a gauge named by
  :func:`metric_name` (``perf/step_time`` -> ``slick_perf_step_time_seconds``, ``rollout/raw_reward`` ->
  ``slick_rollout_raw_reward``), updated when the step is logged;
- **events** counted as they happen: trained samples and tokens, the staleness of each trained sample,
  each request's generation latency, each reward call's latency and failures by reward type (:class:`RunEvents`,
  made first: the reward hub and the rollout manager are built with its hooks);
- **live state** read at each scrape: buffer size and age of its oldest group, the trainer's version, each
  engine's up/down and weight version (``engine=<url>``; ``engine="local"`` for the in-process engine), the
  driver's RSS, and on Ray each trainer rank's RSS and last call times (``rank=<n>``; the ranks send them back
  with every result, see ``slick/cluster/trainer_group.py``).

The engines' own ``slick serve`` ``/metrics`` stay where they are; the exporter writes
``RUN_DIR/prometheus_targets.json`` (Prometheus ``file_sd_configs`` format) listing this endpoint (job
``slick-train``) and every engine server (job ``slick-engine``), so one Prometheus scrape config finds them all.
The metric list and the dashboard are in docs/observability.md.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Optional
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from slick.proc.children import rss_bytes
from slick.types import Status

log = logging.getLogger("slick")

PREFIX = "slick_"
TARGETS_FILE = "prometheus_targets.json"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
REWARD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32)
ENGINE_TIMEOUT_S = 1.0
# the families of fixed name (the step gauges take the other names)
FAMILIES = ("slick_steps", "slick_trained_samples", "slick_trained_tokens", "slick_rollout_staleness",
            "slick_rollout_request_latency_seconds", "slick_reward_latency_seconds", "slick_reward_scored",
            "slick_reward_failed", "slick_step", "slick_trainer_version", "slick_buffer_groups",
            "slick_buffer_oldest_group_age_seconds", "slick_buffer_put_groups", "slick_buffer_dropped_stale_groups",
            "slick_process_rss_bytes", "slick_trainer_rank_call_seconds", "slick_engine_up",
            "slick_engine_weight_version")


# promtool check metrics: no abbreviated units, no suffix of another metric type on a gauge
UNIT_WORDS = {"s": "seconds", "sec": "seconds", "secs": "seconds",      # the value is kept: MiB stays MiB
              "kb": "kibibytes", "mb": "mebibytes", "gb": "gibibytes"}
GAUGE_SUFFIXES = {"count": "number", "total": "all", "sum": "summed", "bucket": "bucket_value"}


def metric_name(key: str) -> str:
    """The Prometheus name of a metrics.jsonl key: ``slick_`` + the key with every run of characters outside
    ``[a-zA-Z0-9_]`` turned into ``_``, lower-cased; keys ending in ``_time`` (seconds) get ``_seconds``. Names
    pass ``promtool check metrics``: an abbreviated unit word is spelled out (``_s``/``_sec`` -> ``_seconds``,
    ``per_sec`` -> ``per_second``, ``_mb`` -> ``_mebibytes``: slick's ``_mb`` values are MiB) and a gauge does not end in ``_count``/``_total``/``_sum``/``_bucket``
    (``_count`` -> ``_number``). ``perf/step_time`` -> ``slick_perf_step_time_seconds``;
    ``perf/tokens_per_sec`` -> ``slick_perf_tokens_per_second``; ``rollout/zero_std/count`` ->
    ``slick_rollout_zero_std_number``; ``eval/heldout-pass@4`` -> ``slick_eval_heldout_pass_4``."""
    parts = re.sub(r"[^a-zA-Z0-9_]+", "_", key).strip("_").lower().split("_")
    parts = [p for p in parts if p]
    for i, p in enumerate(parts):
        if p in UNIT_WORDS:
            parts[i] = "second" if i > 0 and parts[i - 1] == "per" else UNIT_WORDS[p]
    if parts and parts[-1] in GAUGE_SUFFIXES:
        parts[-1] = GAUGE_SUFFIXES[parts[-1]]
    if parts and parts[-1] == "time":
        parts.append("seconds")
    return PREFIX + "_".join(parts)


def engine_weight_version(url: str, timeout: float = ENGINE_TIMEOUT_S) -> Optional[int]:
    """``GET url/get_weight_version`` of a `slick serve` (or SGLang) server; ``None`` when it does not answer."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/get_weight_version", timeout=timeout) as r:
            return int(json.loads(r.read().decode())["weight_version"])
    except Exception:  # noqa: BLE001 - any failure means "down" for this scrape
        return None


class _LiveCollector:
    """Families computed at scrape time: step gauges and the live state of the run's parts."""

    def __init__(self, exporter: "RunExporter"):
        self.x = exporter

    def describe(self):
        return []        # names vary with the run's metrics; nothing to check at registration

    def collect(self):
        x = self.x
        with x.lock:
            step_values = dict(x.step_values)
            step = x.step
        for name, (key, value) in sorted(step_values.items()):
            g = GaugeMetricFamily(name, f"metrics.jsonl {key} of the last logged step.")
            g.add_metric([], value)
            yield g
        g = GaugeMetricFamily("slick_step", "Rollout steps done (the step of the last metrics.jsonl row).")
        g.add_metric([], step)
        yield g
        yield from self._buffer()
        yield from self._trainer()
        yield from self._engines()

    def _buffer(self):
        buf = self.x.buffer
        if buf is None:
            return
        stats = buf.stats()
        g = GaugeMetricFamily("slick_buffer_groups", "Groups waiting in the rollout buffer.")
        g.add_metric([], stats["buffer/groups"])
        yield g
        g = GaugeMetricFamily("slick_buffer_oldest_group_age_seconds",
                              "Seconds the oldest group in the buffer has waited (0 when empty).")
        g.add_metric([], buf.oldest_age())
        yield g
        c = CounterMetricFamily("slick_buffer_put_groups", "Groups put into the buffer (producer side; use rate()).")
        c.add_metric([], buf.num_put)
        yield c
        c = CounterMetricFamily("slick_buffer_dropped_stale_groups", "Groups dropped for staleness.")
        c.add_metric([], stats["buffer/dropped_stale_groups"])
        yield c

    def _trainer(self):
        x = self.x
        rss = GaugeMetricFamily("slick_process_rss_bytes", "Resident memory of a slick process.", labels=["rank"])
        rss.add_metric(["driver"], rss_bytes())
        calls = GaugeMetricFamily("slick_trainer_rank_call_seconds",
                                  "Seconds of a trainer rank's last call of a Trainer method (Ray ranks).",
                                  labels=["rank", "method"])
        version = None
        if x.trainer is not None:
            try:
                version = x.trainer.version
            except Exception:  # noqa: BLE001 - a trainer that is shutting down
                version = None
            for r, st in enumerate(getattr(x.trainer, "rank_states", None) or []):
                if st.get("rss_bytes") is not None:
                    rss.add_metric([str(r)], st["rss_bytes"])
                for method, sec in sorted((st.get("seconds") or {}).items()):
                    calls.add_metric([str(r), method], sec)
        yield rss
        yield calls
        if version is not None:
            g = GaugeMetricFamily("slick_trainer_version", "The trainer's weight version (optimizer steps).")
            g.add_metric([], version)
            yield g

    def _engines(self):
        up = GaugeMetricFamily("slick_engine_up", "1 when the engine answered this scrape, else 0.", labels=["engine"])
        ver = GaugeMetricFamily("slick_engine_weight_version", "Weight version the engine reports.",
                                labels=["engine"])
        urls = self.x.engine_urls
        if urls:     # polled in parallel: a scrape waits at most ENGINE_TIMEOUT_S for dead engines
            with ThreadPoolExecutor(min(len(urls), 16), thread_name_prefix="slick-prom") as pool:
                versions = list(pool.map(engine_weight_version, urls))
            for url, v in zip(urls, versions):
                up.add_metric([url], 0 if v is None else 1)
                if v is not None:
                    ver.add_metric([url], v)
        local = self.x.local_engine
        if local is not None:
            v = None
            for _ in range(3):   # stats() reads state the engine's thread is changing: retry a collision
                try:
                    v = int(local.stats()["weight_version"])
                    break
                except Exception:  # noqa: BLE001 - a closed engine is down
                    time.sleep(0.01)
            up.add_metric(["local"], 0 if v is None else 1)
            if v is not None:
                ver.add_metric(["local"], v)
        yield up
        yield ver


class RunEvents:
    """The run's event counters and their registry (no server): made before the parts that report into them, which
    get :meth:`observe_reward` / :meth:`observe_generated` as constructor hooks (``RewardHub(on_scored=...)``,
    ``RolloutManager(on_generated=...)``); :class:`RunExporter` serves them. Thread-safe (prometheus_client)."""

    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.steps = Counter("slick_steps", "Rollout steps logged.", registry=r)
        self.trained_samples = Counter("slick_trained_samples", "Samples trained on (consumer side; use rate()).",
                                       registry=r)
        self.trained_tokens = Counter("slick_trained_tokens", "Response tokens of the samples trained on.",
                                      registry=r)
        self.staleness = Histogram("slick_rollout_staleness", "Per trained sample: trainer version minus the version "
                                   "of its oldest token.", buckets=STALENESS_BUCKETS, registry=r)
        self.request_latency = Histogram("slick_rollout_request_latency_seconds", "Generation time of one sample "
                                         "(all its turns and continuations).", buckets=LATENCY_BUCKETS, registry=r)
        self.reward_latency = Histogram("slick_reward_latency_seconds", "Time one reward call took, per reward type.",
                                        ["reward_type"], buckets=REWARD_BUCKETS, registry=r)
        self.reward_scored = Counter("slick_reward_scored", "Samples scored, per reward type.", ["reward_type"],
                                     registry=r)
        self.reward_failed = Counter("slick_reward_failed", "Samples whose reward failed (given --rm-failure-reward), "
                                     "per reward type.", ["reward_type"], registry=r)

    def observe_trained(self, samples: list, train_version: int) -> None:
        """Samples handed to the trainer at ``train_version``: counts, tokens, staleness."""
        self.trained_samples.inc(len(samples))
        self.trained_tokens.inc(sum(len(s.response_ids) for s in samples))
        for s in samples:
            if s.weight_versions:
                self.staleness.observe(train_version - min(s.weight_versions))

    def observe_generated(self, samples: list) -> None:
        """Samples whose generation finished (one latency per sample)."""
        for s in samples:
            t = s.timings.get("generate")
            if t is not None and s.status != Status.ABORTED:     # an aborted request continues later
                self.request_latency.observe(float(t))

    def observe_reward(self, sample: Any) -> None:
        """One scored sample (``RewardHub(on_scored=...)``): latency and failure by ``evidence["reward_type"]``."""
        ev = sample.evidence or {}
        kind = str(ev.get("reward_type") or "unknown")
        self.reward_scored.labels(kind).inc()
        self.reward_latency.labels(kind).observe(float(ev.get("seconds") or 0.0))
        if ev.get("error"):
            self.reward_failed.labels(kind).inc()


class RunExporter:
    """The run's /metrics endpoint. ``port`` 0 picks a free port (see :attr:`port`). Thread-safe: the
    event loop, the training thread and the reward workers all report into it. ``events``: the run's
    :class:`RunEvents` (a fresh one when not given)."""

    def __init__(self, run_dir, *, host: str = "127.0.0.1", port: int = 0, buffer: Any = None, trainer: Any = None,
                 engine_urls: Iterable[str] = (), local_engine: Any = None, events: Optional[RunEvents] = None):
        from prometheus_client import start_http_server

        self.run_dir = Path(run_dir)
        self.buffer, self.trainer, self.local_engine = buffer, trainer, local_engine
        self.engine_urls = list(engine_urls)
        self.lock = threading.Lock()
        self.step_values: dict[str, tuple[str, float]] = {}
        self.step = 0
        self.events = events if events is not None else RunEvents()
        self.registry = r = self.events.registry
        self._fixed = {n + sfx for n in FAMILIES for sfx in ("", "_total")}   # jsonl keys never shadow these
        r.register(_LiveCollector(self))
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=r)
        except OSError as e:
            raise OSError(f"--prometheus-port {port}: cannot serve /metrics on {host}:{port}: {e}") from None
        self.host, self.port = host, self.server.server_port
        self.url = f"http://{host}:{self.port}/metrics"
        self.write_targets()
        log.info("prometheus metrics at %s (scrape targets in %s)", self.url, self.run_dir / TARGETS_FILE)

    # ------------------------------------------------------------------ reports
    def observe_step(self, metrics: dict, step: int) -> None:
        """The step's metrics (what metrics.jsonl gets) as gauges; ``step`` = steps done."""
        values = {}
        for key, v in metrics.items():
            if "/hist/" in key:       # per-lag counts: the slick_rollout_staleness histogram has them
                continue
            try:
                f = float(v)
            except (TypeError, ValueError):
                continue
            name = metric_name(key)
            if name not in self._fixed:
                values[name] = (key, f)
        with self.lock:
            self.step_values.update(values)
            self.step = step
        self.events.steps.inc()

    def observe_trained(self, samples: list, train_version: int) -> None:
        self.events.observe_trained(samples, train_version)

    def observe_generated(self, samples: list) -> None:
        self.events.observe_generated(samples)

    def observe_reward(self, sample: Any) -> None:
        self.events.observe_reward(sample)

    # ------------------------------------------------------------------ discovery and shutdown
    def write_targets(self) -> Path:
        """``RUN_DIR/prometheus_targets.json`` for Prometheus' ``file_sd_configs``."""
        groups = [{"targets": [f"{self.host}:{self.port}"], "labels": {"job": "slick-train"}}]
        engines = [urlparse(u).netloc for u in self.engine_urls if urlparse(u).netloc]
        if engines:
            groups.append({"targets": engines, "labels": {"job": "slick-engine"}})
        path = self.run_dir / TARGETS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups, indent=1))
        tmp.replace(path)
        return path

    def close(self) -> None:
        """Stop the HTTP server and join its thread (at most 5 s)."""
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()
            self.thread.join(timeout=5.0)


def start_exporter(logging_cfg, run_dir, *, events: Optional[RunEvents], buffer: Any, trainer: Any,
                   engines: Any) -> Optional[RunExporter]:
    """The run's exporter when ``--prometheus-port`` is set (else ``None``): it serves ``events`` (the reward hub
    and the rollout manager were built with its hooks) and the live state of the buffer, the trainer and the
    engines (an ``EngineSet``, or None). ``logging_cfg``: the logging group (``--prometheus-host``/``-port``)."""
    cfg = logging_cfg
    if cfg.prometheus_port is None:
        return None
    urls = list(getattr(engines, "worker_urls", []) or []) if engines else []
    local = engines.engine if engines is not None and not urls and hasattr(engines.engine, "stats") else None
    return RunExporter(run_dir, host=cfg.prometheus_host, port=int(cfg.prometheus_port), buffer=buffer,
                       trainer=trainer, engine_urls=urls, local_engine=local, events=events)


def wait_for_metric(url: str, name: str, timeout: float = 10.0) -> str:
    """The exposition text of ``url`` once it names ``name`` (for tests and scripts); ``TimeoutError`` naming
    the url and the metric after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2.0) as r:
                last = r.read().decode()
            if re.search(rf"^{re.escape(name)}(\{{| )", last, re.M):
                return last
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not export {name} within {timeout:g}s")

"""Metrics sinks: one JSON line per step in ``run_dir/metrics.jsonl``, plus TensorBoard and wandb on request.

The JSONL file is the source of truth (plots and resumption read it back). Each line goes out as one
``os.write`` and opening the file (a resumed run) first cuts a partial last line left by a crash or a full
disk (slick/observe/appendlog.py), so a crash loses at most the line being written and never corrupts the
next one; ``read_metrics`` tolerates a truncated last line (a run writing it right now) with a warning and
names file and line for any other corrupt line.

Metric names follow slime so dashboards carry over: ``rollout/raw_reward``,
``rollout/response_len/mean``, ``rollout/truncated_ratio``, ``rollout/zero_std/count``,
``train/loss``, ``train/pg_loss``, ``train/pg_clipfrac``, ``train/ppo_kl``, ``train/kl_loss``,
``train/entropy_loss``, ``train/grad_norm``, ``train/train_rollout_logprob_abs_diff``,
``perf/rollout_time``, ``perf/train_time``, ``perf/update_weights_time``, ``perf/step_time``,
``perf/tokens_per_sec``, ``eval/<name>``, ``eval/<name>-pass@k``.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import time
import warnings
from pathlib import Path
from typing import Any

from slick.observe.appendlog import AppendLog

METRICS_FILE = "metrics.jsonl"
RESERVED = ("step", "time")

KNOWN_METRICS = (
    "rollout/raw_reward", "rollout/response_len/mean", "rollout/truncated_ratio", "rollout/zero_std/count",
    "train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/kl_loss", "train/entropy_loss",
    "train/grad_norm", "train/train_rollout_logprob_abs_diff", "perf/rollout_time", "perf/train_time",
    "perf/update_weights_time", "perf/step_time", "perf/tokens_per_sec",
)


class MetricsCorruptError(ValueError):
    """A line of metrics.jsonl could not be parsed (message names file and line)."""


def _to_float(key: str, value: Any) -> float | None:
    """Turn a metric value into a float (tensors, numpy scalars and bools included); None drops it."""
    if value is None:
        return None
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalars
        value = value.item()
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return _skip(key, value)


_warned: set[str] = set()


def _skip(key: str, value: Any) -> None:
    """Non-numeric metric: warn once per key and drop it (a logging slip must not kill a training run)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"metric {key!r} is not a number ({type(value).__name__}: {value!r:.80}); not logged")
    return None


def _json_value(x: float) -> float | str:
    # JSON has no NaN/inf; keep them readable and round-trippable as strings.
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


class MetricsLogger:
    """Write step metrics to ``run_dir/metrics.jsonl`` and, when asked, TensorBoard (``run_dir/tb``) and wandb.

    ``config`` (a plain dict) is stored in ``run_dir/config.json`` and handed to wandb / TensorBoard text.
    wandb's mode comes from the ``WANDB_MODE`` environment variable (``offline`` needs no network); its
    files go under ``run_dir`` unless ``WANDB_DIR`` is set.
    """

    def __init__(self, run_dir: str | os.PathLike, *, use_tensorboard: bool = False, use_wandb: bool = False,
                 wandb_project: str | None = None, wandb_group: str | None = None,
                 config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file = AppendLog(self.path)       # cuts a partial last line left by a crash or a full disk
        self._tb = None
        self._wandb_run = None
        self._closed = False
        if config is not None:
            (self.run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str), encoding="utf-8")
        if use_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))
            if config is not None:
                self._tb.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
        if use_wandb:
            import wandb

            self._wandb_run = wandb.init(
                project=wandb_project or "slick", group=wandb_group, config=config or {},
                dir=os.environ.get("WANDB_DIR", str(self.run_dir)), name=self.run_dir.name,
                mode=os.environ.get("WANDB_MODE") or None, reinit="create_new",
            )

    def log(self, metrics: dict[str, float], step: int) -> dict[str, float]:
        """Record ``metrics`` at ``step`` in every sink; returns the float-converted metrics.

        Values may be Python/numpy/torch scalars; ``None`` values are dropped, other non-numbers are dropped
        with a warning (once per key). Keys ``step`` and ``time``
        are reserved. The JSONL line is written (one ``os.write``) before returning; a failed write (disk
        full) raises :class:`slick.observe.appendlog.AppendLogError` naming the file, which still ends with
        its last complete line.
        """
        if self._closed:
            raise RuntimeError(f"MetricsLogger for {self.run_dir} is closed")
        clean: dict[str, float] = {}
        for k, v in metrics.items():
            if k in RESERVED:
                raise ValueError(f"metric name {k!r} is reserved in {self.path}")
            f = _to_float(k, v)
            if f is not None:
                clean[k] = f
        line = {"step": int(step), "time": time.time()}
        line.update({k: _json_value(v) for k, v in clean.items()})
        self._file.write_line(json.dumps(line, allow_nan=False))
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, global_step=int(step))
            self._tb.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(clean, step=int(step))
        return clean

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _from_json_value(v: Any) -> Any:
    if isinstance(v, str) and v in ("NaN", "Infinity", "-Infinity"):
        return float(v.replace("Infinity", "inf"))
    return v


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """Read ``run_dir/metrics.jsonl`` (or a path to the file itself) back into a list of dicts.

    A truncated last line (a crash mid-write) is skipped with a warning; any other bad line raises
    :class:`MetricsCorruptError` naming the file and line number. A missing file raises FileNotFoundError.
    """
    p = Path(run_dir)
    path = p if p.is_file() else p / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    complete_last = text.endswith("\n")
    if complete_last:
        lines = lines[:-1]
    rows: list[dict] = []
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        is_last = i == len(lines)
        try:
            row = json.loads(raw)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("expected a JSON object with a 'step' field")
        except ValueError as e:
            if is_last and not complete_last:
                warnings.warn(f"{path}:{i}: skipping truncated last line (crash while writing?): {e}")
                continue
            raise MetricsCorruptError(f"{path}:{i}: corrupt metrics line: {e}: {raw[:200]!r} (remove or repair "
                                      f"line {i} to read the file)") from None
        rows.append({k: _from_json_value(v) for k, v in row.items()})
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of metric ``key`` over ``rows`` (rows lacking it are skipped)."""
    xs, ys = [], []
    for r in rows:
        if key in r and r[key] is not None:
            xs.append(int(r["step"]))
            ys.append(float(r[key]))
    return xs, ys

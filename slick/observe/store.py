"""The rollout store: every trained sample of a run as Parquet rows under ``RUN_DIR/rollouts/``.

One file per stored step, ``step_00000012.parquet``, one row per sample (schema: :data:`SCHEMA`, documented in
docs/observability.md). A file is written to a hidden temporary name and renamed into place, so a reader (or a
crash) sees a file complete or not at all; readers skip names starting with ``.`` (pyarrow's default).

Read it with ``pyarrow.dataset.dataset(RUN_DIR / "rollouts")`` or :func:`read_rollouts` (a pandas frame).
The ``step`` column counts as metrics.jsonl does: the rows of ``step 3`` are the samples trained by the third
step, whose metrics row has ``"step": 3``.

Size bound: after each write, the oldest step files are deleted until the store is under ``max_mb`` (the newest
file always stays), with one warning the first time; the store keeps a rolling window of the latest steps.
"""
from __future__ import annotations

import importlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Iterable, Optional

from slick.config import Config
from slick.config.groups import RolloutStoreConfig

log = logging.getLogger("slick")

STORE_DIR = "rollouts"
FILE_GLOB = "step_*.parquet"


def _schema():
    import pyarrow as pa

    ints, floats = pa.list_(pa.int32()), pa.list_(pa.float32())
    return pa.schema([
        ("step", pa.int64()), ("index", pa.int64()), ("group_index", pa.int64()), ("prompt_index", pa.int64()),
        ("epoch", pa.int64()), ("prompt", pa.string()), ("response", pa.string()), ("label", pa.string()),
        ("metadata", pa.string()), ("prompt_ids", ints), ("response_ids", ints),
        ("response_tokens", pa.list_(pa.string())), ("loss_mask", pa.list_(pa.int8())),
        ("rollout_logprobs", floats), ("weight_versions", ints), ("response_length", pa.int32()),
        ("reward", pa.float64()), ("reward_raw", pa.string()), ("reward_error", pa.string()),
        ("evidence", pa.string()), ("verdict", pa.string()), ("answer", pa.string()), ("status", pa.string()),
        ("timings", pa.string()), ("train_version", pa.int64()), ("staleness", pa.int64()), ("time", pa.float64()),
    ])


def store_dir(run_dir) -> Path:
    """``RUN_DIR/rollouts`` (a path that already is a store directory is returned as is)."""
    p = Path(run_dir)
    return p if p.name == STORE_DIR or (p.is_dir() and any(p.glob(FILE_GLOB))) else p / STORE_DIR


def _json(value: Any) -> Optional[str]:
    if value is None:
        return None
    return json.dumps(value, default=str, allow_nan=True)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _short(value: Any) -> Optional[str]:
    return None if value is None else str(value)


class RolloutStore:
    """Writes the samples of every ``interval``-th step (``step % interval == 0``, 1-based) to Parquet.

    ``tokenizer`` (optional) decodes each response token into ``response_tokens`` for `slick rollouts --show`
    and the inspector. ``max_mb`` <= 0 means unbounded.
    """

    def __init__(self, run_dir, *, interval: int = 1, max_mb: float = 512.0, tokenizer=None):
        if interval < 1:
            raise ValueError(f"--rollout-store-interval must be >= 1 (got {interval})")
        importlib.import_module("pyarrow.parquet")    # imported now, not inside the first step's timing
        self.dir = Path(run_dir) / STORE_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob(".*.tmp"):     # left by a crash mid-write: never a complete file
            tmp.unlink(missing_ok=True)
        self.interval, self.max_bytes = int(interval), int(max_mb * (1 << 20)) if max_mb > 0 else 0
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}
        self._warned = False

    @classmethod
    def from_config(cls, cfg: RolloutStoreConfig | Config, run_dir, tokenizer=None) -> Optional["RolloutStore"]:
        """The store the rollout_store group (``slick.config.groups.RolloutStoreConfig``) asks for, or None for
        --no-rollout-store / --rollout-store-interval 0."""
        if cfg.no_rollout_store or not cfg.rollout_store_interval:
            return None
        return cls(run_dir, interval=cfg.rollout_store_interval, max_mb=cfg.rollout_store_max_mb, tokenizer=tokenizer)

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def _tokens(self, ids: list[int]) -> Optional[list[str]]:
        """Each id decoded on its own; a run's ids repeat, so each distinct id is decoded once per store."""
        if self.tokenizer is None or not ids:
            return None
        pieces = self._pieces
        new = set(ids).difference(pieces)
        if new:
            pieces.update((t, self.tokenizer.decode([int(t)])) for t in new)
        return [pieces[t] for t in ids]

    def rows(self, step: int, samples: Iterable, rewards: list[float], train_versions: Optional[list[int]]) -> list[dict]:
        now, rows = time.time(), []
        for i, s in enumerate(samples):
            meta = s.metadata if isinstance(s.metadata, dict) else {}
            evidence = getattr(s, "evidence", None) or None
            tv = int(train_versions[i]) if train_versions is not None else None
            versions = list(s.weight_versions)          # pyarrow converts the lists to the schema's types
            r = rewards[i] if rewards is not None else None
            rows.append({
                "step": int(step), "index": int(s.index), "group_index": int(s.group_index),
                "prompt_index": int(s.prompt_index), "epoch": int(s.epoch), "prompt": _text(s.prompt),
                "response": s.response or "", "label": _json(s.label),
                "metadata": _json({k: v for k, v in meta.items() if k not in ("reward_error",)}),
                "prompt_ids": list(s.prompt_ids), "response_ids": list(s.response_ids),
                "response_tokens": self._tokens(s.response_ids), "loss_mask": list(s.loss_mask),
                "rollout_logprobs": list(s.rollout_logprobs), "weight_versions": versions,
                "response_length": len(s.response_ids),
                "reward": float(r) if r is not None and math.isfinite(float(r)) else None,
                "reward_raw": _json(s.reward), "reward_error": _short(meta.get("reward_error")),
                "evidence": _json(evidence),
                "verdict": _short(evidence.get("verdict")) if isinstance(evidence, dict) else None,
                "answer": _short(evidence.get("answer")) if isinstance(evidence, dict) else None,
                "status": getattr(s.status, "value", str(s.status)), "timings": _json(s.timings or {}),
                "train_version": tv, "staleness": tv - min(versions) if tv is not None and versions else None,
                "time": now,
            })
        return rows

    def write(self, step: int, samples: list, rewards: list[float], train_versions: Optional[list[int]] = None
              ) -> Optional[Path]:
        """Write ``step``'s samples (when due) as one Parquet file; returns its path (None when not due/empty).
        ``rewards`` are the scalars training used; ``train_versions`` the trainer's version at each sample's
        optimizer step."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.due(step) or not samples:
            return None
        table = pa.Table.from_pylist(self.rows(step, samples, rewards, train_versions), schema=_schema())
        path = self.dir / f"step_{step:08d}.parquet"
        tmp = self.dir / f".{path.name}.{os.getpid()}.tmp"
        try:
            pq.write_table(table, tmp, compression="zstd")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self._bound(keep=path)
        return path

    def _bound(self, keep: Path) -> None:
        if not self.max_bytes:
            return
        files = sorted(self.dir.glob(FILE_GLOB))
        sizes = {f: f.stat().st_size for f in files}
        total = sum(sizes.values())
        for f in files:
            if total <= self.max_bytes or f == keep:
                break
            f.unlink(missing_ok=True)
            total -= sizes[f]
            if not self._warned:
                self._warned = True
                log.warning("rollout store %s is over --rollout-store-max-mb %.0f: deleting its oldest step files "
                            "(first: %s); it keeps the latest steps", self.dir, self.max_bytes / (1 << 20), f.name)


class StoreMissingError(FileNotFoundError):
    """No rollout store (or an empty one) where one was asked for; the message says where and why."""


def step_files(run_dir) -> list[Path]:
    """The complete step files of a store, oldest first; :class:`StoreMissingError` when there are none."""
    d = store_dir(run_dir)
    if not Path(run_dir).exists():
        raise StoreMissingError(f"{run_dir}: no such run directory")
    if not d.is_dir():
        raise StoreMissingError(f"{d}: no rollout store here (slick train writes one unless --no-rollout-store; "
                                f"--debug-rollout-only runs write none)")
    files = sorted(d.glob(FILE_GLOB))
    if not files:
        raise StoreMissingError(f"{d}: the rollout store is empty (no step has been trained and stored yet)")
    return files


def stored_steps(run_dir) -> list[int]:
    return [int(f.stem.split("_")[1]) for f in step_files(run_dir)]


def read_table(run_dir, columns: Optional[list[str]] = None, steps: Optional[Iterable[int]] = None):
    """The store (or the files of ``steps``) as one pyarrow Table, optionally only ``columns``."""
    import pyarrow.dataset as ds

    files = step_files(run_dir)
    if steps is not None:
        want = {int(s) for s in steps}
        files = [f for f in files if int(f.stem.split("_")[1]) in want]
    if not files:
        return _empty(columns)
    try:
        return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=columns)
    except (OSError, ValueError):    # pyarrow's ArrowInvalid is a ValueError: a step file is unreadable
        return _read_each(files, columns)


def _read_each(files: list[Path], columns: Optional[list[str]]):
    """The readable step files one by one; each unreadable one (not written by slick's atomic rename: a disk
    error, a copy cut short) is skipped with a warning naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for f in files:
        try:
            names = pq.read_schema(f).names
        except (OSError, ValueError) as e:
            log.warning("rollout store: skipping unreadable step file %s (%s)", f, e)
            continue
        missing = [c for c in columns or () if c not in names]
        if missing:
            raise ValueError(f"{f}: the rollout store file has no column(s) {missing}")
        try:
            tables.append(pq.read_table(f, columns=columns))
        except (OSError, ValueError) as e:
            log.warning("rollout store: skipping unreadable step file %s (%s)", f, e)
    return pa.concat_tables(tables, promote_options="default") if tables else _empty(columns)


def _empty(columns: Optional[list[str]]):
    import pyarrow as pa

    schema = _schema()
    return schema.empty_table().select(columns) if columns else pa.Table.from_pylist([], schema=schema)


def read_rollouts(run_dir, columns: Optional[list[str]] = None, steps: Optional[Iterable[int]] = None):
    """:func:`read_table` as a pandas DataFrame."""
    return read_table(run_dir, columns, steps).to_pandas()


def loads(text: Optional[str]) -> Any:
    """A JSON column's value back as Python (None stays None)."""
    return None if text is None else json.loads(text)


def store_step(store: Optional[RolloutStore], step: int, samples, rewards, train_versions=None) -> dict:
    """The training loop's hook: write ``step`` (1-based) when due and return ``perf/rollout_store_time``.
    A failed write (disk full, permissions) is logged and training goes on without that step's file."""
    if store is None or not store.due(step):
        return {}
    t0 = time.perf_counter()
    try:
        store.write(step, samples, rewards, train_versions)
    except OSError as e:
        log.warning("rollout store: step %d not written to %s: %s", step, store.dir, e)
    return {"perf/rollout_store_time": time.perf_counter() - t0}

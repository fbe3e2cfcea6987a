"""What the inspector page shows, computed from a run directory's files on each call (a run still writing them
is read as it is now): metrics.jsonl curves, per-step distributions and staleness from the rollout store, the
best and worst samples of a step, one sample's tokens. Every function returns plain JSON-able data."""
from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Optional

from slick.observe.metrics import read_metrics
from slick.observe.rollouts_cli import token_rows
from slick.observe.store import StoreMissingError, loads, read_table, step_files

SUMMARY_COLUMNS = ["step", "reward", "response_length", "staleness", "status", "reward_error", "verdict"]
CARD_COLUMNS = ["step", "index", "group_index", "prompt_index", "reward", "response_length", "status", "verdict",
                "answer", "staleness", "train_version", "prompt", "response", "label", "evidence", "reward_error"]


def _clean(value):
    """NaN/inf -> None (strict JSON), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def run_info(run_dir) -> dict:
    import yaml

    run_dir = Path(run_dir)
    cfg = {}
    if (run_dir / "config.yaml").is_file():
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    reward = cfg.get("reward", {}) if isinstance(cfg, dict) else {}
    try:
        steps = [int(f.stem.split("_")[1]) for f in step_files(run_dir)]
        store_message = None
    except StoreMissingError as e:
        steps, store_message = [], str(e)
    files = [run_dir / "metrics.jsonl"] + ([] if not steps else step_files(run_dir))
    mtimes = [f.stat().st_mtime for f in files if f.exists()]
    algo = cfg.get("algorithm", {}) if isinstance(cfg, dict) else {}
    return {"run_dir": str(run_dir), "name": run_dir.resolve().name, "stored_steps": steps,
            "store_message": store_message, "updated": max(mtimes) if mtimes else None,
            "verifier": reward.get("custom_rm_path") or reward.get("rm_type"),
            "model": (cfg.get("train", {}) or {}).get("hf_checkpoint") if isinstance(cfg, dict) else None,
            "advantage_estimator": algo.get("advantage_estimator"),
            "trace": trace.name if (trace := trace_file(run_dir)) is not None else None}


def trace_file(run_dir) -> Optional[Path]:
    """The run's --trace-file (config.yaml's logging.trace_file, relative to the run directory), when it exists."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    cfg = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.is_file() else {}
    name = ((cfg.get("logging") or {}) if isinstance(cfg, dict) else {}).get("trace_file")
    if not name:
        return None
    trace = Path(name) if Path(name).is_absolute() else Path(run_dir) / name
    return trace if trace.is_file() else None


def metrics(run_dir) -> dict:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")             # a running run's half-written last line is skipped
            rows = read_metrics(run_dir)
    except FileNotFoundError as e:
        return {"keys": [], "rows": [], "message": str(e)}
    keys = sorted({k for r in rows for k in r if k not in ("step", "time")})
    return {"keys": keys, "rows": _clean(rows)}


def _hist(values: list[float], lo: float, hi: float, bins: int) -> list[int]:
    counts = [0] * bins
    width = (hi - lo) / bins if hi > lo else 1.0
    for v in values:
        counts[min(bins - 1, max(0, int((v - lo) / width)))] += 1
    return counts


def steps_summary(run_dir, bins: int = 10) -> dict:
    """Per stored step: count, reward mean/min/max/quartiles, histograms of reward and length over shared
    bins, staleness mean/max, truncated and failed-reward counts, verdict counts."""
    try:
        df = read_table(run_dir, columns=SUMMARY_COLUMNS).to_pandas()
    except StoreMissingError as e:
        return {"steps": [], "message": str(e)}
    rewards = df["reward"].dropna()
    r_lo, r_hi = (float(rewards.min()), float(rewards.max())) if len(rewards) else (0.0, 1.0)
    if r_hi <= r_lo:
        r_lo, r_hi = r_lo - 0.5, r_hi + 0.5
    l_lo, l_hi = 0.0, float(max(df["response_length"].max(), 1))
    out = []
    for step, g in df.groupby("step", sort=True):
        r = g["reward"].dropna()
        st = g["staleness"].dropna()
        verdicts = g["verdict"].dropna().astype(str).value_counts().to_dict()
        out.append({"step": int(step), "n": int(len(g)),
                    "reward_mean": float(r.mean()) if len(r) else None,
                    "reward_min": float(r.min()) if len(r) else None, "reward_max": float(r.max()) if len(r) else None,
                    "reward_q": [float(x) for x in r.quantile([0.25, 0.5, 0.75])] if len(r) else None,
                    "reward_hist": _hist(list(r), r_lo, r_hi, bins),
                    "len_mean": float(g["response_length"].mean()), "len_max": int(g["response_length"].max()),
                    "len_hist": _hist(list(g["response_length"]), l_lo, l_hi, bins),
                    "staleness_mean": float(st.mean()) if len(st) else None,
                    "staleness_max": int(st.max()) if len(st) else None,
                    "truncated": int((g["status"] == "truncated").sum()),
                    "reward_failures": int(g["reward_error"].notna().sum()),
                    "verdicts": {str(k): int(v) for k, v in verdicts.items()}})
    return _clean({"steps": out, "reward_range": [r_lo, r_hi], "len_range": [l_lo, l_hi], "bins": bins})


def samples(run_dir, step: Optional[int] = None, order: str = "best", limit: int = 5) -> dict:
    """The ``limit`` best (highest reward, then shortest) or worst samples of ``step`` (default: the latest)."""
    if order not in ("best", "worst"):
        raise ValueError(f"order must be 'best' or 'worst', got {order!r}")
    try:
        steps = [int(f.stem.split("_")[1]) for f in step_files(run_dir)]
    except StoreMissingError as e:
        return {"step": None, "samples": [], "message": str(e)}
    step = steps[-1] if step is None else int(step)
    if step not in steps:
        raise KeyError(f"step {step} is not in the rollout store (stored: {steps[:5]}{'...' if len(steps) > 5 else ''}"
                       f"{steps[-1:] if len(steps) > 5 else ''})")
    rows = read_table(run_dir, columns=CARD_COLUMNS, steps=[step]).to_pylist()
    best = order == "best"
    rows.sort(key=lambda r: (-(r["reward"] if r["reward"] is not None else -math.inf) if best
                             else (r["reward"] if r["reward"] is not None else -math.inf),
                             r["response_length"], r["index"]))
    for r in rows:
        r["evidence"], r["label"] = loads(r["evidence"]), loads(r["label"])
    return _clean({"step": step, "order": order, "samples": rows[:max(0, int(limit))]})


def sample(run_dir, step: int, index: int) -> dict:
    """One stored sample in full, with ``tokens``: per response token its text, loss mask, logprob, version."""
    import pyarrow.compute as pc

    table = read_table(run_dir, steps=[int(step)])
    hits = table.filter(pc.equal(table["index"], int(index))).to_pylist()
    if not hits:
        raise KeyError(f"sample {index} is not in stored step {step}")
    row = hits[0]
    row["tokens"] = token_rows(row)
    for k in ("evidence", "label", "metadata", "reward_raw", "timings"):
        row[k] = loads(row[k])
    for k in ("prompt_ids", "response_ids", "response_tokens", "loss_mask", "rollout_logprobs", "weight_versions"):
        row.pop(k, None)
    return _clean(row)

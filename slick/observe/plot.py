"""`slick plot RUN_DIR [--out DIR]`: PNG curves from a run directory's metrics.jsonl.

Writes ``reward.png`` (rollout/raw_reward), ``eval.png`` (every eval/* curve), ``response_len.png``
(rollout/response_len/mean), ``kl.png`` (train/ppo_kl, train/kl_loss) and ``step_time.png`` (a stacked
split of perf/rollout_time, perf/train_time, perf/update_weights_time and any other perf/*_time, with
perf/step_time drawn as a line when present) and, for slick train-async runs, ``activity.png`` (per step: the
trainer's busy and idle seconds, the rollout side's idle seconds and the seconds paused for weight updates).
A plot whose metrics are absent is skipped with a note.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from slick.observe.metrics import METRICS_FILE, read_metrics, series

TIME_ORDER = ("perf/rollout_time", "perf/train_time", "perf/update_weights_time")
STEP_TIME = "perf/step_time"
# slick train-async: what the trainer (consumer) and the rollout side (producer) did in each step
ACTIVITY = ("perf/train_time", "perf/trainer_idle_time", "perf/trainer_yield_time", "perf/rollout_idle_time",
            "perf/paused_time")


def _keys(rows: list[dict]) -> set[str]:
    keys: set[str] = set()
    for r in rows:
        keys.update(k for k in r if k not in ("step", "time"))
    return keys


def _time_keys(keys: set[str]) -> list[str]:
    """perf/*_time parts of a step (not the total perf/step_time), in a stable order."""
    others = sorted(k for k in keys if k.startswith("perf/") and k.endswith("_time")
                    and k != STEP_TIME and k not in TIME_ORDER and k != "perf/rollout_idle_time")
    return [k for k in TIME_ORDER if k in keys] + others


def figure_specs(rows: list[dict]) -> dict[str, list[str]]:
    """Which metric keys each PNG would plot (empty list -> that plot is skipped)."""
    keys = _keys(rows)
    return {
        "reward.png": [k for k in ("rollout/raw_reward",) if k in keys],
        "eval.png": sorted(k for k in keys if k.startswith("eval/") and k.count("/") == 1),  # scores only
        "response_len.png": [k for k in ("rollout/response_len/mean",) if k in keys],
        "kl.png": [k for k in ("train/ppo_kl", "train/kl_loss") if k in keys],
        "step_time.png": _time_keys(keys),
        "activity.png": [k for k in ACTIVITY if k in keys] if "perf/trainer_idle_time" in keys else [],
    }


def _line_figure(rows: list[dict], keys: list[str], title: str, ylabel: str):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for k in keys:
        xs, ys = series(rows, k)
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=k)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(keys) > 1 or title == "eval":
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _step_time_figure(rows: list[dict], keys: list[str]):
    """Stacked area of the per-phase times over steps; rows missing a part count it as 0."""
    import matplotlib.pyplot as plt

    steps = sorted({int(r["step"]) for r in rows if any(k in r for k in keys)})
    by_step: dict[int, dict] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), {}).update(r)
    stacks = [[float(by_step[s].get(k, 0.0) or 0.0) for s in steps] for k in keys]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    ax.stackplot(steps, *stacks, labels=[k.removeprefix("perf/") for k in keys], alpha=0.8)
    xs, ys = series(rows, STEP_TIME)
    if xs:
        ax.plot(xs, ys, color="black", linewidth=1.2, label="step_time (total)")
    ax.set_title("step time split")
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def build_figures(rows: list[dict]) -> dict[str, object]:
    """Matplotlib figures by file name, for the plots whose metrics exist (caller closes them)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    specs = figure_specs(rows)
    figs: dict[str, object] = {}
    meta = {"reward.png": ("rollout reward", "raw reward"), "eval.png": ("eval", "score"),
            "response_len.png": ("response length", "tokens"), "kl.png": ("KL", "value"),
            "activity.png": ("producer / consumer activity (train-async)", "seconds per step")}
    for name, keys in specs.items():
        if not keys:
            continue
        if name == "step_time.png":
            figs[name] = _step_time_figure(rows, keys)
        else:
            figs[name] = _line_figure(rows, keys, *meta[name])
    return figs


def plot_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
             log=print) -> list[Path]:
    """Write the PNGs for ``run_dir`` into ``out_dir`` (default ``run_dir/plots``); return their paths.

    Plots whose metrics are missing are skipped with a note through ``log``. Raises FileNotFoundError
    when ``run_dir/metrics.jsonl`` does not exist.
    """
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in run directory {run_dir} (expected {run_dir / METRICS_FILE})")
    rows = read_metrics(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    specs = figure_specs(rows)
    figs = build_figures(rows)
    written: list[Path] = []
    for name, keys in specs.items():
        if name not in figs:
            log(f"[slick plot] skipping {name}: no matching metrics in {run_dir / METRICS_FILE}")
            continue
        path = out / name
        figs[name].savefig(path)
        plt.close(figs[name])
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """CLI entry: ``slick plot RUN_DIR [--out DIR]``; exit 2 when the run dir has no metrics.jsonl."""
    ap = argparse.ArgumentParser(prog="slick plot", description="Write PNG curves from RUN_DIR/metrics.jsonl.")
    ap.add_argument("run_dir", help="run directory holding metrics.jsonl")
    ap.add_argument("--out", default=None, help="output folder for PNGs (default RUN_DIR/plots)")
    args = ap.parse_args(argv)
    try:
        paths = plot_run(args.run_dir, args.out)
    except FileNotFoundError as e:
        print(f"slick plot: {e}", file=sys.stderr)
        return 2
    except ValueError as e:  # corrupt metrics line (names file and line)
        print(f"slick plot: {e}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())

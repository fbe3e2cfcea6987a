"""Observability: metrics sinks (JSONL, TensorBoard, wandb), a progress bar, pass@k, and plots.

Imports are lazy so that ``import slick.observe`` stays cheap (no torch, no matplotlib).
"""
from __future__ import annotations

__all__ = ["MetricsLogger", "read_metrics", "Progress", "pass_at_k", "eval_metrics", "plot_run"]


def __getattr__(name: str):
    # import cost: each name loads its module when first read, so `import slick.observe` stays cheap
    if name in ("MetricsLogger", "read_metrics"):
        from slick.observe import metrics
        return getattr(metrics, name)
    if name == "Progress":
        from slick.observe.progress import Progress
        return Progress
    if name in ("pass_at_k", "eval_metrics"):
        from slick.rollout import passk   # pass@k lives with the eval that computes it
        return getattr(passk, name)
    if name == "plot_run":
        from slick.observe.plot import plot_run
        return plot_run
    raise AttributeError(f"module 'slick.observe' has no attribute {name!r}")

"""Evaluation: sample the eval datasets with the current policy and report mean reward and pass@k."""
from __future__ import annotations

import asyncio
import copy
import time

from slick.config import Config
from slick.rollout.passk import eval_metrics
from slick.rollout.manager import sampling_from_config
from slick.types import Sample


def eval_groups(dataset, n: int) -> list[list[Sample]]:
    """One group of ``n`` samples per eval prompt (fresh objects each call)."""
    groups = []
    for i in range(len(dataset)):
        row = dataset[i]
        base = Sample(index=i * n, group_index=i, prompt_index=row["prompt_index"], prompt=row["prompt"],
                      label=row["label"], metadata=dict(row.get("metadata") or {}), tools=row.get("tools"),
                      prompt_ids=list(row["prompt_ids"]))
        groups.append([copy.deepcopy(base) for _ in range(n)])
        for j, s in enumerate(groups[-1]):
            s.index = i * n + j
    return groups


async def evaluate(cfg: Config, manager, datasets: dict) -> dict:
    """Evaluate every named dataset with ``manager``'s engine and reward hub; returns eval/* metrics."""
    t0 = time.perf_counter()
    k = cfg.n_samples_per_eval_prompt
    eos = [manager.tok.eos_token_id] if manager.tok.eos_token_id is not None else []
    sampling = sampling_from_config(cfg, eval=True, stop_token_ids=eos)
    metrics: dict = {}
    for name, dataset in datasets.items():
        groups = eval_groups(dataset, k)
        done = await asyncio.gather(*(manager.run_group(g, sampling) for g in groups))
        rewards = [[manager.rewards.scalar(s) for s in g] for g in done]
        metrics.update(eval_metrics(name, rewards, k))
        lengths = [len(s.response_ids) for g in done for s in g]
        metrics[f"eval/{name}/response_len"] = sum(lengths) / max(len(lengths), 1)
    metrics["perf/eval_time"] = time.perf_counter() - t0
    return metrics

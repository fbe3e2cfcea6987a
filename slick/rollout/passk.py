"""Unbiased pass@k (Chen et al., 2021) and eval metrics per dataset.

A sample *passes* when its reward is at least ``PASS_THRESHOLD`` (0.5). Rule rewards in slick are 1.0
for a correct answer and 0.0 (or a small negative/format score) otherwise, so any threshold in (0, 1)
separates them; 0.5 also counts a partially scaled "correct" reward (e.g. 0.9 for a correct answer with a
length penalty) as a pass. Dict rewards must be reduced to a float before calling these functions.
"""
from __future__ import annotations

from math import comb

PASS_THRESHOLD = 0.5


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn without replacement from ``n`` (``c`` correct)
    is correct: ``1 - C(n-c, k) / C(n, k)``. Requires ``0 <= c <= n`` and ``1 <= k <= n``."""
    if not (0 <= c <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def eval_metrics(name: str, rewards_per_prompt: list[list[float]], k: int,
                 threshold: float = PASS_THRESHOLD) -> dict[str, float]:
    """Eval metrics for dataset ``name``: ``{"eval/<name>": mean reward over all samples,
    "eval/<name>-pass@<k>": mean over prompts of pass@k}``.

    Each inner list holds the rewards of one prompt's samples (all must have at least ``k`` samples).
    With ``k == 1`` pass@1 is the mean pass rate. The pass@k key is omitted when ``k`` is None.
    """
    if not rewards_per_prompt:
        raise ValueError(f"eval_metrics({name!r}): no prompts")
    total, count, passk = 0.0, 0, 0.0
    for i, rewards in enumerate(rewards_per_prompt):
        if not rewards:
            raise ValueError(f"eval_metrics({name!r}): prompt {i} has no samples")
        rewards = [float(r) for r in rewards]
        total += sum(rewards)
        count += len(rewards)
        if k is not None:
            if len(rewards) < k:
                raise ValueError(f"eval_metrics({name!r}): prompt {i} has {len(rewards)} samples < k={k}")
            passk += pass_at_k(len(rewards), sum(r >= threshold for r in rewards), k)
    out = {f"eval/{name}": total / count}
    if k is not None:
        out[f"eval/{name}-pass@{k}"] = passk / len(rewards_per_prompt)
    return out

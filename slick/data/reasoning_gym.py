"""``--prompt-data reasoning-gym:TASK[,TASK...][?size=N&seed=S&system=NAME&KEY=VALUE...]``: reasoning-gym's
procedural tasks as a prompt dataset (docs/data.md; ``pip install 'slick[envs]'``).

- ``size`` (default 1000): items per task; ``seed`` (default 0): which items (slick.reward.reasoning_gym: the
  generator gets a seed mixed from (task, seed), so another seed gives other items; use one for the held-out set);
- ``system`` (default ``default``): which of reasoning-gym's ``SYSTEM_PROMPTS`` opens the prompt as a system
  message (each asks for the final answer between ``<answer>`` and ``</answer>``); ``none``: the prompt is the
  question alone, a plain string;
- any other ``KEY=VALUE`` is a field of every listed task's config (``min_terms=2``; JSON values: numbers,
  ``true``/``false``, else the text).

Row ``i`` is item ``i // k`` of task ``i % k`` (k tasks, interleaved), so the rows are ``size * k``, the same for
a seed in every process: a resumed run neither loses nor repeats a prompt. Each row's label is the item's answer
and ``metadata["reasoning_gym"]`` names the item, which ``--rm-type reasoning_gym`` scores with the task's own
verifier (slick/reward/reasoning_gym.py).
"""
from __future__ import annotations

from slick.reward import reasoning_gym as rg
from slick.reward.reasoning_gym import ReasoningGymSpecError, check, is_spec, parse, system_prompts

__all__ = ["ReasoningGymSpecError", "is_spec", "load_rows", "parse"]


def load_rows(spec: str) -> tuple[list, list]:
    """(rows, where) of a ``reasoning-gym:`` spec in :func:`slick.data.dataset.load_prompt_rows`'s shape:
    ``{"prompt_index", "prompt", "label", "metadata", "tools"}`` and per row ``spec item N of TASK``."""
    check(spec)
    s = parse(spec)
    system = None if s.system == "none" else system_prompts()[s.system]
    try:
        per_task = rg.load([(t, s.seed, s.size, s.config) for t in s.tasks])
    except rg.ReasoningGymError as e:
        raise ReasoningGymSpecError(f"{spec}: {e}") from None
    rows, where = [], []
    k = len(s.tasks)
    for i in range(s.size * k):
        task, j = s.tasks[i % k], i // k
        entry = per_task[i % k][j]
        question = str(entry["question"])
        prompt = question if system is None else [{"role": "system", "content": system},
                                                  {"role": "user", "content": question}]
        meta = {rg.META_KEY: {"task": task, "seed": s.seed, "size": s.size, "config": dict(s.config), "index": j}}
        rows.append({"prompt_index": i, "prompt": prompt, "label": str(entry["answer"]), "metadata": meta,
                     "tools": None})
        where.append(f"{spec} item {j} of {task}")
    return rows, where

"""slime's ``rm_hub``: ``async_rm(args, sample)`` and ``batched_async_rm(args, samples)``, the rule-based rewards
plug-ins call directly, with slime's dispatch: a ``--custom-rm-path`` function when set, else ``rm_type`` (the
sample's ``metadata["rm_type"]`` first, then ``args.rm_type``; a ``boxed_`` prefix grades the response's boxed
answer): ``deepscaler`` (1/0), ``dapo`` (DAPO's dict, score 1.0/-1.0), ``math`` (``grade_answer_verl``, 1/0),
``random`` (0 or 1) and ``remote_rm`` (POST ``{prompt, response, label}`` to ``args.rm_url``). slime's ``f1``,
``gpqa`` and ``ifbench`` are not in this stand-in: each raises ``NotImplementedError`` naming slick's own
``--rm-type`` to use instead. Modules: ``math_utils``, ``math_dapo_utils``, ``deepscaler``.
"""
from __future__ import annotations

import asyncio
import importlib
import random

from slick.compat.slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slick.compat.slime.rollout.rm_hub.math_dapo_utils import compute_score as compute_score_dapo
from slick.compat.slime.rollout.rm_hub.math_utils import extract_answer as extract_boxed_answer
from slick.compat.slime.rollout.rm_hub.math_utils import grade_answer_verl
from slick.compat.slime.utils.http_utils import post

__all__ = ["async_rm", "batched_async_rm", "grade_answer_verl", "get_deepscaler_rule_based_reward",
           "compute_score_dapo", "extract_boxed_answer"]
_ELSEWHERE = {"f1": "slick's --rm-type f1", "gpqa": "slick's --rm-type gpqa",
              "ifbench": "an IFBench scorer of your own (--custom-rm-path)"}


def _load(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


async def remote_rm(args, sample):
    return await post(args.rm_url, {"prompt": sample.prompt, "response": sample.response, "label": sample.label})


async def async_rm(args, sample, **kwargs):
    path = getattr(sample, "custom_rm_path", None) or args.custom_rm_path
    if path:
        return await _load(path)(args, sample, **kwargs)
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = (metadata.get("rm_type") or args.rm_type or "").strip()
    response, label = sample.response, sample.label
    if rm_type.startswith("boxed_"):
        response, rm_type = extract_boxed_answer(response) or "", rm_type[len("boxed_"):]
    if rm_type == "remote_rm":
        return await remote_rm(args, sample)
    if rm_type == "deepscaler":
        return get_deepscaler_rule_based_reward(response, label)
    if rm_type == "dapo":
        return compute_score_dapo(response, label)
    if rm_type == "math":
        return 1 if grade_answer_verl(response, label) else 0
    if rm_type == "random":
        return random.randint(0, 1)
    if rm_type in _ELSEWHERE:
        raise NotImplementedError(f"rm_type {rm_type!r} is not in slick's slime.rollout.rm_hub: use "
                                  f"{_ELSEWHERE[rm_type]}")
    raise NotImplementedError(f"Rule-based RM for {rm_type} is not implemented." if rm_type
                              else "Rule-based RM type is not specified.")


async def batched_async_rm(args, samples, **kwargs):
    path = args.custom_rm_path
    if path:
        return await _load(path)(args, samples, **kwargs)
    return list(await asyncio.gather(*(async_rm(args, s, **kwargs) for s in samples)))

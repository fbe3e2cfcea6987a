"""slime-shaped views of slick's objects, for plug-ins written against slime (rollout filters, reward functions,
generate functions: slick/rollout/slime_generate.py). Duck-typed on slick's ``Sample``, so this bottom room imports
nothing of slick's but the stand-in itself."""
from __future__ import annotations

import inspect
from typing import Any, Callable

from slick.compat.slime.utils.types import Sample as SlimeSample


def is_slime_plugin(fn: Callable) -> bool:
    """Whether ``fn``'s module imports from slime (the real package or slick's stand-in)."""
    mod = inspect.getmodule(fn)
    names = [getattr(v, "__name__", "") if inspect.ismodule(v) else getattr(v, "__module__", "") or ""
             for v in vars(mod).values()] if mod is not None else []
    names.append(getattr(fn, "__module__", "") or "")
    return any(n == "slime" or n.startswith(("slime.", "slick.compat.slime")) for n in names)


def to_slime(sample: Any, prompt_text: str) -> SlimeSample:
    """A slime-shaped copy of ``sample`` (its metadata dict is shared)."""
    n = len(sample.response_ids)
    return SlimeSample(group_index=sample.group_index, index=sample.index, prompt=prompt_text,
                       tokens=list(sample.prompt_ids) + list(sample.response_ids), response=sample.response,
                       response_length=n, label=sample.label, reward=sample.reward,
                       loss_mask=list(sample.loss_mask) if n else None,
                       rollout_log_probs=list(sample.rollout_logprobs) if n else None,
                       weight_versions=[str(v) for v in sample.weight_versions],
                       status=SlimeSample.Status(sample.status.value), metadata=sample.metadata)


def slime_prompt(sample: Any, decode: Callable[[list], str], apply_chat_template: bool) -> Any:
    """``sample.prompt`` as slime gives it to plug-ins: with --apply-chat-template the chat-templated text (``decode``
    of the prompt's token ids: what the engine was given), else the prompt as the data row has it (a string, or
    a list of chat messages)."""
    if apply_chat_template:
        return decode(list(sample.prompt_ids))
    return sample.prompt


def prompt_text(sample: Any) -> str:
    """A slick sample's prompt as slime's text field (chat messages joined by content)."""
    p = sample.prompt
    return p if isinstance(p, str) else "\n".join(str(m.get("content", "")) for m in p or [] if isinstance(m, dict))

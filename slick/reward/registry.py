"""Name -> pure scoring function for the built-in rule rewards.

Every entry has the signature ``score(response: str, label, metadata) -> float``.
``boxed_<type>`` scores the content of the response's last ``\\boxed{...}`` with ``<type>``
(no complete box scores 0.0, once ``<type>`` has accepted the label). A label a scorer cannot use
raises :class:`~slick.reward.errors.LabelError`. ``remote_rm`` is not a pure function and lives in the hub.
"""
from __future__ import annotations

from typing import Any, Callable

from slick.config import Config
from slick.reward import code, countdown, gsm8k, math as math_rm, reasoning_gym, slime_rm, text
from slick.reward.evidence import Judgement
from slick.reward.extract import last_boxed

ScoreFn = Callable[[str, Any, dict], float]
JudgeFn = Callable[[str, Any, dict], Judgement]

# the same verifiers with their evidence (slick.reward.evidence); each ``score`` is ``judge(...).score``
JUDGES: dict[str, JudgeFn] = {
    "math": math_rm.judge,
    "gsm8k": gsm8k.judge,
    "exact": text.judge_exact,
    "f1": text.judge_f1,
    "countdown": countdown.judge,
    "code": code.judge,
    "deepscaler": slime_rm.judge_deepscaler,   # slime's rm-hub types (slick/reward/slime_rm.py)
    "dapo": slime_rm.judge_dapo,
    "gpqa": slime_rm.judge_gpqa,
    "reasoning_gym": reasoning_gym.judge,     # the task's own verifier (slick/reward/reasoning_gym.py; envs extra)
}

BUILTIN: dict[str, ScoreFn] = {
    "math": math_rm.score,
    "gsm8k": gsm8k.score,
    "exact": text.score_exact,
    "f1": text.score_f1,
    "countdown": countdown.score,
    "code": code.score,
    "deepscaler": slime_rm.score_deepscaler,
    "dapo": slime_rm.score_dapo,
    "gpqa": slime_rm.score_gpqa,
    "reasoning_gym": reasoning_gym.score,
}
# types whose verifier a run's config shapes (``make(cfg) -> JudgeFn``; the hub builds one per run)
CONFIGURED: dict[str, Callable[[Config], JudgeFn]] = {"code": code.judge_from_config}
REMOTE = "remote_rm"
BOXED_PREFIX = "boxed_"


def known_types() -> list[str]:
    """Every accepted ``--rm-type`` base name (each may also be prefixed ``boxed_``, except remote_rm)."""
    return sorted(BUILTIN) + [REMOTE]


def get_score_fn(rm_type: str) -> ScoreFn:
    """The pure scorer for ``rm_type`` (``boxed_`` variants included); ``ValueError`` if unknown."""
    if rm_type in BUILTIN:
        return BUILTIN[rm_type]
    if rm_type.startswith(BOXED_PREFIX) and rm_type[len(BOXED_PREFIX):] in BUILTIN:
        inner = BUILTIN[rm_type[len(BOXED_PREFIX):]]

        def boxed_score(response: str, label: Any, metadata: dict | None = None) -> float:
            box = last_boxed(response)
            if box is None:
                inner("", label, metadata)   # only to check the label: a bad one raises LabelError
                return 0.0
            return inner(box, label, metadata)

        boxed_score.__name__ = f"score_{rm_type}"
        return boxed_score
    if rm_type in slime_rm.REFUSED:
        raise ValueError(f"--rm-type {rm_type}: not offered ({slime_rm.REFUSED[rm_type]})")
    raise ValueError(f"unknown reward type {rm_type!r} (choose from {', '.join(known_types())}, "
                     f"or boxed_<type> for the rule types)")


def get_judge_fn(rm_type: str, cfg: Config | None = None) -> JudgeFn:
    """Like :func:`get_score_fn`, but the function returns a :class:`Judgement` (score, extracted answer,
    verdict, extras); ``boxed_<type>`` adds the extra ``box`` (the box content, ``None`` without a box).
    With ``cfg``, a :data:`CONFIGURED` type gets the verifier built from it (e.g. code: its sandbox pool)."""
    if cfg is not None and rm_type in CONFIGURED:
        return CONFIGURED[rm_type](cfg)
    if rm_type in JUDGES:
        return JUDGES[rm_type]
    if rm_type.startswith(BOXED_PREFIX) and rm_type[len(BOXED_PREFIX):] in JUDGES:
        inner = JUDGES[rm_type[len(BOXED_PREFIX):]]

        def boxed_judge(response: str, label: Any, metadata: dict | None = None) -> Judgement:
            box = last_boxed(response)
            if box is None:
                inner("", label, metadata)   # only to check the label: a bad one raises LabelError
                return Judgement.binary(False, None, box=None)
            j = inner(box, label, metadata)
            j.extras["box"] = box
            return j

        boxed_judge.__name__ = f"judge_{rm_type}"
        return boxed_judge
    get_score_fn(rm_type)      # raises the ValueError naming the unknown type
    raise AssertionError(rm_type)


def builtin_score(rm_type: str, response: str, label: Any, metadata: dict | None = None) -> float:
    """Score one response with a built-in rule reward; handy inside custom reward functions."""
    return get_score_fn(rm_type)(response, label, metadata or {})

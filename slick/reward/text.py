"""String rewards: ``exact`` (stripped equality) and ``f1`` (SQuAD-style token F1).

A label may be a single answer (a string or a number) or a non-empty list of them; the best match
counts. Anything else (None, a bool, a dict, nested lists) raises :class:`LabelError`.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

from slick.reward.errors import label_error
from slick.reward.evidence import Judgement

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


_EXPECTED = "a string, a number, or a non-empty list of them"


def _is_answer(x: Any) -> bool:
    return isinstance(x, (str, int, float)) and not isinstance(x, bool)


def _answers(label: Any) -> list[str]:
    if isinstance(label, (list, tuple)):
        if not label or not all(_is_answer(x) for x in label):
            raise label_error("text (exact/f1)", _EXPECTED, label)
        return [str(x) for x in label]
    if not _is_answer(label):
        raise label_error("text (exact/f1)", _EXPECTED, label)
    return [str(label)]


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, reference: str) -> float:
    """Token-level F1 between two strings after :func:`normalize_answer`.

    Two empty strings score 1.0; one empty string scores 0.0.
    """
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def judge_exact(response: str, label: Any, metadata: dict | None = None) -> Judgement:
    """The exact-match verdict; ``answer`` is the stripped response."""
    resp = (response or "").strip()
    return Judgement.binary(any(resp == a.strip() for a in _answers(label)), resp)


def judge_f1(response: str, label: Any, metadata: dict | None = None) -> Judgement:
    """Best token F1 over the labels; verdict: an exact match after normalisation (F1 == 1); extras ``f1``
    and ``best_label``."""
    answers = _answers(label)
    f1s = [token_f1(response or "", a) for a in answers]
    best = max(range(len(answers)), key=f1s.__getitem__)
    return Judgement(f1s[best], (response or "").strip(), f1s[best] == 1.0,
                     {"f1": f1s[best], "best_label": answers[best]})


def score_exact(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 when ``response.strip()`` equals (one of) the stripped label(s), else 0.0."""
    return judge_exact(response, label, metadata).score


def score_f1(response: str, label: Any, metadata: dict | None = None) -> float:
    """Best token F1 between the response and (each of) the label(s), in [0, 1]."""
    return judge_f1(response, label, metadata).score

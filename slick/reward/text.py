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


def score_exact(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 when ``response.strip()`` equals (one of) the stripped label(s), else 0.0."""
    resp = (response or "").strip()
    return 1.0 if any(resp == a.strip() for a in _answers(label)) else 0.0


def score_f1(response: str, label: Any, metadata: dict | None = None) -> float:
    """Best token F1 between the response and (each of) the label(s), in [0, 1]."""
    return max(token_f1(response or "", a) for a in _answers(label))

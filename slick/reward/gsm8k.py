"""``gsm8k`` reward: the final number of the response compared numerically with the label.

The response's answer is the first number after its last ``####``; without ``####`` it is the
last number anywhere in the response. Commas and ``$`` are stripped (``$1,234.50`` is 1234.5).
The label may be a bare number or a GSM8K solution ending in ``#### 42``. Values compare
exactly as fractions, so ``42``, ``42.0`` and ``+42`` all match. Returns 1.0 or 0.0.
"""
from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Optional

from slick.reward.errors import LabelError, label_error
from slick.reward.evidence import Judgement, fraction_text

# An optional sign and `$`, then digits with optional thousands commas and decimals, or `.5`.
_NUMBER = re.compile(r"[-+]?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)")


def _to_fraction(token: str) -> Optional[Fraction]:
    cleaned = token.replace(",", "").replace("$", "").replace(" ", "")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(text: str) -> Optional[Fraction]:
    """The first number after the last ``####``, else the last number in ``text``; ``None`` if none."""
    text = text or ""
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        m = _NUMBER.search(tail)
        if m:
            return _to_fraction(m.group())
    found = _NUMBER.findall(text)
    return _to_fraction(found[-1]) if found else None


def judge(response: str, label: Any, metadata: dict | None = None) -> Judgement:
    """The gsm8k verdict with evidence: ``answer`` is the response's final number (``"5/2"`` for 2.5,
    ``None`` when there is none), ``gold`` the label's. Raises :class:`LabelError` as :func:`score` does."""
    if isinstance(label, bool) or not isinstance(label, (int, float, str)):
        raise label_error("gsm8k", "a number or a string", label)
    if isinstance(label, int):
        gold = Fraction(label)
    elif isinstance(label, float):
        try:
            gold = Fraction(repr(label))
        except ValueError:          # nan / inf
            raise label_error("gsm8k", "a finite number", label) from None
    else:
        gold = extract_number(label)
    if gold is None:
        raise LabelError(f"gsm8k reward: no number in label {str(label)[:80]!r}")
    pred = extract_number(response)
    return Judgement.binary(pred is not None and pred == gold, fraction_text(pred), gold=fraction_text(gold))


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 when the response's final number equals the label's number, else 0.0.

    The label must be an int, a float or a string. Raises :class:`LabelError` (a ``ValueError``)
    for any other type and for a label that holds no number (a data problem the hub reports).
    """
    return judge(response, label, metadata).score

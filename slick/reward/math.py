"""``math`` reward: math-verify equivalence of the response's answer with the label.

The predicted answer is the last ``\\boxed{...}`` of the response when there is one, else
whatever math-verify extracts from the whole response. The label is parsed as LaTeX (it is
wrapped in ``$...$`` unless it already carries ``$`` or ``\\boxed``). Returns 1.0 or 0.0.

math-verify's own timeouts use ``signal.alarm``, which only works in the main thread; the hub
runs rewards in worker threads, so they are disabled here and the hub enforces ``--rm-timeout``.
"""
from __future__ import annotations

import numbers
from typing import Any

from slick.reward.errors import LabelError, label_error
from slick.reward.evidence import Judgement
from slick.reward.extract import last_boxed


def _quiet_math_verify() -> None:
    # math-verify warns once that its signal timeout is off; the hub owns timeouts instead.
    import math_verify.grader as grader
    import math_verify.parser as parser

    parser.TIMEOUT_WARNING_SHOWN = True
    grader.TIMEOUT_WARNING_SHOWN = True


def _as_latex(text: str) -> str:
    text = text.strip()
    if "$" in text or "\\boxed" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


def parse_gold(label: Any) -> list:
    """Parse a label into math-verify's answer list (empty when nothing parses)."""
    from math_verify import parse

    _quiet_math_verify()
    text = str(label).strip()
    gold = parse(_as_latex(text), parsing_timeout=None)
    return gold or parse(text, parsing_timeout=None)


def parse_answer(response: str) -> list:
    """Parse the response's answer: the last box's content if any, else the whole response."""
    from math_verify import parse

    _quiet_math_verify()
    box = last_boxed(response)
    if box is not None:
        return parse(f"${box}$", parsing_timeout=None) or parse(box, parsing_timeout=None)
    return parse(response or "", parsing_timeout=None)


def _answer_text(parsed: list) -> str:
    """The string math-verify extracted (its last element), else the first parsed object as text."""
    strings = [x for x in parsed if isinstance(x, str)]
    return strings[-1] if strings else str(parsed[0])


def judge(response: str, label: Any, metadata: dict | None = None) -> Judgement:
    """The math verdict with evidence: ``answer`` is the extracted answer text (``None`` when math-verify
    found none), ``gold`` the label as parsed. Raises :class:`LabelError` as :func:`score` does."""
    from math_verify import verify

    if isinstance(label, bool) or not isinstance(label, (str, numbers.Real)):
        raise label_error("math", "a string or a number", label)
    gold = parse_gold(label)
    if not gold:
        raise LabelError(f"math reward: cannot parse label {str(label)[:80]!r}")
    pred = parse_answer(response)
    if not pred:
        return Judgement.binary(False, None, gold=_answer_text(gold))
    return Judgement.binary(bool(verify(gold, pred, timeout_seconds=None)), _answer_text(pred),
                            gold=_answer_text(gold))


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 when the response's answer is mathematically equivalent to ``label``, else 0.0.

    The label must be a string or a number (not a bool). Raises :class:`LabelError` (a
    ``ValueError``) when it is not, or cannot be parsed: a data problem, reported by the hub as a
    reward failure rather than silently scored 0.
    """
    return judge(response, label, metadata).score

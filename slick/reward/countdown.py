"""``countdown`` reward: an arithmetic expression over given numbers that must hit a target.

The label is ``{"target": int, "numbers": [int, ...]}`` (a dict or its JSON text) or ``None``;
when the label lacks them, ``metadata["target"]`` / ``metadata["numbers"]`` are used. Any other
label (a list, a number, JSON that is not an object) or a missing or malformed field raises
:class:`~slick.reward.errors.LabelError`.

The expression is the content of the last ``<answer>...</answer>`` in the response, else its
last non-empty line. If it contains ``=``, the first side that is not a bare number is used
(so ``(6+4)*5 = 50`` and ``50 = (6+4)*5`` both work). ``×``, ``÷`` and ``−`` are read as
``*``, ``/`` and ``-``.

The expression is parsed with :mod:`ast` and evaluated by walking the tree with exact
:class:`~fractions.Fraction` arithmetic; nothing is ever ``eval``-ed. Allowed: non-negative
integer literals, binary ``+ - * /`` and parentheses. Anything else (names, calls, unary
minus, powers, floats) scores 0. Each given number must be used exactly once (as a multiset),
and the value must equal the target; division by zero scores 0. There is no format reward:
the result is 1.0 or 0.0.
"""
from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from fractions import Fraction
from typing import Any, Optional

from slick.reward.errors import LabelError, label_error
from slick.reward.evidence import Judgement, fraction_text

MAX_EXPR_CHARS = 512
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_TRANSLATE = str.maketrans({"×": "*", "÷": "/", "−": "-"})


class _Rejected(Exception):
    """The expression uses something outside the allowed grammar."""


def parse_task(label: Any, metadata: dict | None = None) -> tuple[int, list[int]]:
    """Return ``(target, numbers)`` from the label (dict or JSON) or, failing that, the metadata.

    Raises :class:`LabelError` (a ``ValueError``) naming the wrong label type or the missing or
    malformed field.
    """
    task = label
    if isinstance(task, str):
        try:
            task = json.loads(task)
        except json.JSONDecodeError as e:
            raise LabelError(f"countdown label is not JSON: {label[:80]!r} ({e})") from None
    if task is not None and not isinstance(task, dict):
        raise label_error("countdown", 'a dict like {"target": 50, "numbers": [4, 5, 6]}, its JSON text, or None',
                          task)
    task = dict(task or {})
    for key in ("target", "numbers"):
        if key not in task and metadata and key in metadata:
            task[key] = metadata[key]
    if "target" not in task or "numbers" not in task:
        raise LabelError(f"countdown needs 'target' and 'numbers' in the label or metadata (label={label!r})")
    target, numbers = task["target"], task["numbers"]
    if isinstance(target, bool) or not isinstance(target, int):
        raise LabelError(f"countdown 'target' must be an int, got {target!r}")
    if not isinstance(numbers, (list, tuple)) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                         for n in numbers):
        raise LabelError(f"countdown 'numbers' must be a list of ints, got {numbers!r}")
    return target, list(numbers)


def extract_expression(response: str) -> Optional[str]:
    """The candidate expression text (see module docstring), or ``None`` when there is none."""
    answers = _ANSWER.findall(response or "")
    if answers:
        text = answers[-1]
    else:
        lines = [ln for ln in (response or "").splitlines() if ln.strip()]
        if not lines:
            return None
        text = lines[-1]
    text = text.translate(_TRANSLATE).strip()
    if "=" in text:
        sides = [s.strip() for s in text.split("=") if s.strip()]
        complex_sides = [s for s in sides if not re.fullmatch(r"\d+", s)]
        text = complex_sides[0] if complex_sides else (sides[0] if sides else "")
    return text or None


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _walk(node.left, used), _walk(node.right, used)
        return _OPS[type(node.op)](left, right)      # ZeroDivisionError propagates
    raise _Rejected(type(node).__name__)


def evaluate(expr: str) -> tuple[Fraction, list[int]]:
    """Value and the list of integer literals of ``expr``.

    Raises ``ValueError`` for anything outside the grammar and ``ZeroDivisionError`` on x/0.
    """
    if len(expr) > MAX_EXPR_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"not an expression: {e}") from None
    used: list[int] = []
    try:
        value = _walk(tree, used)
    except _Rejected as e:
        raise ValueError(f"disallowed syntax: {e}") from None
    return value, used


def judge(response: str, label: Any, metadata: dict | None = None) -> Judgement:
    """The countdown verdict with evidence: ``answer`` is the expression read (``None`` when there is none);
    extras ``target``, ``numbers``, ``value`` (its exact value as text, ``None`` when it could not be
    evaluated), ``numbers_used`` and ``reason`` (why it failed, ``None`` when correct)."""
    target, numbers = parse_task(label, metadata)
    expr = extract_expression(response)
    extras = {"target": target, "numbers": numbers, "value": None, "numbers_used": None}
    if expr is None:
        return Judgement.binary(False, None, **extras, reason="no expression")
    try:
        value, used = evaluate(expr)
    except ZeroDivisionError:
        return Judgement.binary(False, expr, **extras, reason="division by zero")
    except (ValueError, RecursionError) as e:
        return Judgement.binary(False, expr, **extras, reason=str(e) or type(e).__name__)
    extras.update(value=fraction_text(value), numbers_used=used)
    if Counter(used) != Counter(numbers):
        return Judgement.binary(False, expr, **extras, reason="numbers not used exactly once")
    if value != target:
        return Judgement.binary(False, expr, **extras, reason="value is not the target")
    return Judgement.binary(True, expr, **extras, reason=None)


def score(response: str, label: Any, metadata: dict | None = None) -> float:
    """1.0 when the response's expression uses each given number once and equals the target."""
    return judge(response, label, metadata).score

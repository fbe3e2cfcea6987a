"""The calculator task of the agent demo and of ``examples/calculator``: a safe calculator tool and
multiplication questions that SmolLM2-135M cannot answer reliably alone.

``calculator(expression)`` evaluates ``+ - * / // % **`` and parentheses over integer and decimal
literals by walking the :mod:`ast` tree (nothing is ever ``eval``-ed), in exact fractions. Every
intermediate result is bounded, not just the answer: its magnitude by :data:`MAX_MAGNITUDE` ("result too
large") and its numerator and denominator by :data:`MAX_BITS` bits ("result too precise"), and a power is
refused *before* it is computed when its result could not fit (exponents are whole numbers of at most
:data:`MAX_EXPONENT`). With at most :data:`MAX_EXPRESSION_CHARS` characters, every input is answered in well
under 0.1 s (``((1.0000001 ** 64) ** 64) ** 64`` used to take two minutes). A bad expression raises
:class:`CalculatorError`; the multi-turn rollout turns that into an ``Error: ...`` tool message (counted in
``rollout/tool_errors``) and the conversation goes on.
``TOOLS`` is what ``--tool-path slick.demo.calculator:TOOLS`` loads.

``calculator_rows`` builds chat rows ``{"prompt", "label", "metadata", "tools"}`` with a seeded, disjoint
held-out split; ``tools`` holds ``CALCULATOR_SCHEMA`` (OpenAI function format) for ``--tool-key tools``. The
prompt is a system message, one worked example (question, call, tool result, answer) and the question.
SmolLM2-135M almost never writes a well-formed Hermes ``<tool_call>`` JSON (0 of 32 tries, measured), but it
often answers with a bare expression, so the demo's call format is that: ``parse_expression_call``
(``--tool-parser``) reads a turn that is only an arithmetic expression as a calculator call, and Hermes calls
as usual.
``final_answer_reward`` (``--custom-rm-path``) scores only the last assistant turn, so a number that merely
appears in a tool result earns nothing.
"""
from __future__ import annotations

import ast
import math
import operator
import random
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Optional

from slick.chat.toolcall import ToolCall, parse_hermes
from slick.demo.addition import write_jsonl
from slick.reward.gsm8k import score
from slick.rollout.multiturn import final_answer

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10 ** 40
MAX_BITS = 4096          # of the numerator and of the denominator of every intermediate result
_MAX_LOG2 = MAX_MAGNITUDE.bit_length()

CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

SYSTEM_PROMPT = ("You are a helpful assistant with a calculator. To use it, reply with only the arithmetic "
                 "expression, like 12 * 34; its result comes back in a tool message. Then reply with just the number.")
QUESTION = "What is {a} * {b}?"

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_TRANSLATE = str.maketrans({"×": "*", "x": "*", "÷": "/", "−": "-", ",": ""})


class CalculatorError(ValueError):
    """The expression is not one the calculator accepts; the message says why."""


def _check(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("result too large")
    if value.numerator.bit_length() > MAX_BITS or value.denominator.bit_length() > MAX_BITS:
        raise CalculatorError(f"result too precise (its exact fraction needs more than {MAX_BITS} bits)")
    return value


def _literal(value) -> Fraction:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result too large")
    return _check(Fraction(str(value)))


def _power(base: Fraction, exp: Fraction) -> Fraction:
    """``base ** exp``, refused before it is computed when the result could not pass :func:`_check`."""
    if exp.denominator != 1 or abs(exp) > MAX_EXPONENT:
        raise CalculatorError(f"exponent must be a whole number of at most {MAX_EXPONENT}")
    e = int(exp)
    if base == 0 and e < 0:
        raise CalculatorError("division by zero")
    if e < 0:
        base, e = 1 / base, -e
    num, den = abs(base.numerator), base.denominator
    # lower bounds of the result's size: |base| > 2**(bits(num) - 1 - bits(den)); bits(n**e) > e * (bits(n) - 1)
    if e * (num.bit_length() - 1 - den.bit_length()) > _MAX_LOG2:
        raise CalculatorError("result too large")
    if e * (max(num.bit_length(), den.bit_length()) - 1) >= MAX_BITS:
        raise CalculatorError(f"result too precise (its exact fraction needs more than {MAX_BITS} bits)")
    return _check(base ** e)   # fewer than MAX_BITS + MAX_EXPONENT bits each: cheap


def _walk(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _literal(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_walk(node.left), _walk(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _walk(node.left), _walk(node.right)
        if right == 0 and type(node.op) in (ast.Div, ast.FloorDiv, ast.Mod):
            raise CalculatorError("division by zero")
        return _check(Fraction(_BINOPS[type(node.op)](left, right)))
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; raises :class:`CalculatorError` for anything else."""
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.translate(_TRANSLATE).strip().rstrip("=").strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CalculatorError(f"not an arithmetic expression: {text!r}") from e
    try:
        return _walk(tree)
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None


def format_number(value: Fraction) -> str:
    """An integer as digits; anything else as a decimal rounded to 6 places, trailing zeros removed."""
    if value.denominator == 1:
        return str(value.numerator)
    try:
        text = f"{Decimal(value.numerator) / Decimal(value.denominator):.6f}".rstrip("0").rstrip(".")
    except InvalidOperation:
        text = str(float(value))
    return text


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Returns the value as text; raises :class:`CalculatorError` for anything that is not arithmetic."""
    return format_number(evaluate(expression))


TOOLS = [calculator]
EXAMPLE = (4821, 1375)


_EXPRESSION_LINE = re.compile(r"[\d\s.()]*\d\s*[-+*/×÷x]\s*[\d\s.()+\-*/×÷x]*")


def parse_expression_call(text: str) -> list:
    """``--tool-parser slick.demo.calculator:parse_expression_call``: Hermes ``<tool_call>`` calls, and a turn
    whose first non-empty line is nothing but an arithmetic expression (``347 * 28``), which calls the calculator.
    A bare number (the final answer) or a sentence is no call."""
    calls = parse_hermes(text)
    if calls:
        return calls
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if lines and _EXPRESSION_LINE.fullmatch(lines[0]):
        return [ToolCall(name="calculator", arguments={"expression": lines[0]})]
    return []


def example_messages(a: int = EXAMPLE[0], b: int = EXAMPLE[1]) -> list[dict]:
    """One worked exchange in the demo's call format: question, expression (the call), tool result, answer.

    It is an addition, not a multiplication: with a multiplication example the base model already gets 81% of
    the held-out questions right with the tool, with this one 71%, and with none 0% (32-48 samples, T=1)."""
    return [{"role": "user", "content": f"What is {a} + {b}?"},
            {"role": "assistant", "content": f"{a} + {b}"},
            {"role": "tool", "content": str(a + b)},
            {"role": "assistant", "content": str(a + b)}]


def final_answer_reward(args, sample) -> float:
    """``--custom-rm-path`` reward: 1.0 when the last number of the last assistant turn equals the label."""
    return score(final_answer(sample), sample.label)


def question_pairs(digits: tuple[int, int] = (3, 2)) -> list[tuple[int, int]]:
    """Every (a, b) with ``digits[0]``- and ``digits[1]``-digit operands, in a fixed order."""
    lo_a, lo_b = 10 ** (digits[0] - 1), 10 ** (digits[1] - 1)
    return [(a, b) for a in range(lo_a, 10 * lo_a) for b in range(lo_b, 10 * lo_b)]


def make_row(a: int, b: int, system_prompt: Optional[str] = SYSTEM_PROMPT, example: bool = True) -> dict:
    messages = (example_messages() if example else []) + [{"role": "user", "content": QUESTION.format(a=a, b=b)}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return {"prompt": messages, "label": str(a * b), "metadata": {"a": a, "b": b},
            "tools": [CALCULATOR_SCHEMA]}


def calculator_rows(n_train: int = 2000, n_test: int = 50, seed: int = 0, digits: tuple[int, int] = (3, 2),
                    system_prompt: Optional[str] = SYSTEM_PROMPT,
                    example: bool = True) -> tuple[list[dict], list[dict]]:
    """(train_rows, test_rows): distinct multiplication questions, none shared between the two splits."""
    pairs = question_pairs(digits)
    if n_train + n_test > len(pairs):
        raise ValueError(f"{digits}-digit operands give only {len(pairs)} questions, "
                         f"asked for {n_train} + {n_test}")
    picked = random.Random(seed).sample(pairs, n_train + n_test)
    rows = [make_row(a, b, system_prompt, example) for a, b in picked]
    return rows[n_test:], rows[:n_test]


def write_calculator_data(out_dir: str | Path, **kw) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` under ``out_dir`` (keyword arguments: :func:`calculator_rows`)."""
    train, test = calculator_rows(**kw)
    out = Path(out_dir)
    return write_jsonl(train, out / "train.jsonl"), write_jsonl(test, out / "test.jsonl")

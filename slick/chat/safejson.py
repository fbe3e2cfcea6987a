"""JSON from text nobody vetted (a policy's tool calls): bounded depth, bounded integers, one error type.

``json.loads`` recurses once per nesting level, so ``'[' * 1200`` raises :class:`RecursionError` (not a
:class:`json.JSONDecodeError`), and an integer literal longer than Python's int-conversion limit raises a plain
:class:`ValueError`. :func:`loads` checks the nesting depth first, in one linear pass that skips string literals,
and refuses anything deeper than ``max_depth`` (:data:`MAX_DEPTH` levels by default) before ``json`` sees it;
every failure is a :class:`JSONLimitError` whose message says what was wrong and where.
"""
from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64
MAX_INT_DIGITS = 4300

# a JSON string literal (closing quote optional, so an unterminated one runs to the end), or a bracket
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class JSONLimitError(ValueError):
    """The text is not JSON (``limit`` False), or is JSON deeper / bigger than the limits allow (``limit``
    True); the message says which."""

    def __init__(self, message: str, limit: bool = True):
        super().__init__(message)
        self.limit = limit


def depth(text: str) -> int:
    """The deepest bracket nesting of ``text`` outside JSON string literals (linear time, no recursion)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text)).encode("ascii")
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def object_end(text: str, pos: int = 0) -> int:
    """Where the JSON object that starts at ``text[pos]`` (after blanks) ends, the index after its closing brace,
    or -1 (no object there, or it never closes). Strings are skipped whole, so a brace or a tag inside one is
    text; linear in the characters scanned."""
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    if pos >= n or text[pos] != "{":
        return -1
    level, i = 0, pos
    while i < n:
        c = text[i]
        if c == '"':
            i = _STRING.match(text, i).end()
            continue
        if c in "{[":
            level += 1
        elif c in "}]":
            level -= 1
            if level == 0:
                return i + 1
        i += 1
    return -1


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise JSONLimitError(f"an integer has {len(digits.lstrip('-'))} digits, more than {MAX_INT_DIGITS} allowed")
    return int(digits)


def loads(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)`` for hostile text: raises :class:`JSONLimitError` for invalid JSON, nesting deeper
    than ``max_depth``, or an integer of more than :data:`MAX_INT_DIGITS` digits; never anything else."""
    levels = depth(text)
    if levels > max_depth:
        raise JSONLimitError(f"nested {levels} levels deep, more than {max_depth} allowed")
    try:
        return json.loads(text, parse_int=_bounded_int)
    except JSONLimitError:
        raise
    except json.JSONDecodeError as e:
        raise JSONLimitError(f"{e.msg} at column {e.colno}", limit=False) from None
    except (ValueError, RecursionError) as e:  # belt and braces: the depth check should make these impossible
        raise JSONLimitError(str(e)) from None

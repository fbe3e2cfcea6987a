"""Answer extraction shared by the rule-based rewards.

``last_boxed`` returns the content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in a text,
matching braces so nested groups such as ``\\boxed{\\frac{1}{2}}`` come back whole.
"""
from __future__ import annotations

import re
from typing import Optional

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str) -> list[str]:
    """Contents of the outermost complete ``\\boxed{...}`` / ``\\fbox{...}`` groups, in order.

    Braces are matched with a depth counter; escaped braces (``\\{``, ``\\}``) do not count.
    An unclosed box (e.g. a response truncated mid-answer) ends the scan.
    """
    out: list[str] = []
    pos = 0
    while True:
        m = _BOX_RE.search(text, pos)
        if m is None:
            return out
        start = i = m.end()
        depth = 1
        while i < len(text) and depth:
            ch = text[i]
            if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2
                continue
            depth += (ch == "{") - (ch == "}")
            i += 1
        if depth:
            return out
        out.append(text[start:i - 1])
        pos = i


def last_boxed(text: str) -> Optional[str]:
    """Stripped content of the last outermost box in ``text``, or ``None`` if there is no complete box.

    ``last_boxed("\\boxed{3} then \\boxed{\\frac{1}{2}}")`` is ``"\\frac{1}{2}"``.
    """
    spans = boxed_contents(text or "")
    return spans[-1].strip() if spans else None

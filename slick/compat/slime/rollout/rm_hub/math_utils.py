"""slime's ``rm_hub.math_utils``: boxed-answer extraction and the MATH grader (``grade_answer_verl``), written for
slick after the published behaviour (slime's own unit tests are the facts tests/test_slime_rm_hub.py checks).

- ``last_boxed_only_string(s)``: the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None;
  ``remove_boxed`` its content (None when ``s`` is not one); ``extract_boxed_answer`` / ``extract_answer`` both.
- ``mathd_normalize_answer`` / ``_strip_string``: the Hendrycks MATH normalisation (``\\frac12`` -> ``\\frac{1}{2}``,
  ``tfrac``/``dfrac`` -> ``frac``, no ``\\left``/``\\right``, degrees, units, spaces, ``.7`` -> ``0.7``,
  ``0.5`` -> ``\\frac{1}{2}``, ``a/b`` -> ``\\frac{a}{b}``); ``grade_answer_mathd`` compares the normalised texts.
- ``grade_answer_sympy``: normalised to plain expressions and compared by sympy (a reducible fraction must match
  as written; an integer answer must be that integer; tuples element by element).
- ``grade_answer_verl(solution, ground_truth)``: the boxed answers of both, equal under either grader.
"""
from __future__ import annotations

import re
from typing import Optional

# ----------------------------------------------------------------------------------------------- boxed answers


def through_closing_brace(string: str, start: int) -> Optional[str]:
    """``string[start:]`` up to the brace that closes the first ``{`` after ``start`` (None when none closes)."""
    depth = 0
    for k in range(start, len(string)):
        if string[k] == "{":
            depth += 1
        elif string[k] == "}":
            depth -= 1
            if depth == 0:
                return string[start:k + 1]
    return None


def last_boxed_only_string(string: Optional[str]) -> Optional[str]:
    if not string:
        return None
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    return through_closing_brace(string, start)


def remove_boxed(s: Optional[str]) -> Optional[str]:
    if not isinstance(s, str):
        return None
    for head in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if s.startswith(head):
            if head.endswith(" "):
                return s[len(head):]
            return s[len(head):-1] if s.endswith("}") else None
    return None


def extract_boxed_answer(solution: str) -> Optional[str]:
    return remove_boxed(last_boxed_only_string(solution))


def extract_answer(passage: str) -> Optional[str]:
    return extract_boxed_answer(passage) if "\\boxed" in passage else None


# ------------------------------------------------------------------------------------- Hendrycks normalisation

def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``, ``\\frac{1}2`` -> ``\\frac{1}{2}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{"):
            if part.count("}") and not re.match(r"^\{[^{}]*\}\{", part):
                m = re.match(r"^(\{[^{}]*\})(.)(.*)$", part, re.S)
                if m and m.group(2) not in "{":
                    part = f"{m.group(1)}{{{m.group(2)}}}{m.group(3)}"
            out += part
        elif len(part) >= 2:
            a, b, rest = part[0], part[1], part[2:]
            out += f"{{{a}}}{b}{rest}" if b == "{" else f"{{{a}}}{{{b}}}{rest}"
        else:
            return s
    return out


def _fix_a_slash_b(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(-?\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def _remove_right_units(s: str) -> str:
    return s.split("\\text{ ")[0] if "\\text{ " in s else s


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _strip_string(string: str) -> str:
    s = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    if len(s.split("=")) == 2 and len(s.split("=")[0]) <= 2:   # "x = 3" -> "3"
        s = s.split("=")[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def mathd_normalize_answer(answer: Optional[str]) -> Optional[str]:
    if answer is None:
        return None
    answer = answer.strip()
    m = re.fullmatch(r"\\text\{(.*)\}", answer, re.S)
    if m:
        answer = m.group(1)
    try:
        return _strip_string(answer)
    except Exception:     # a malformed answer is compared as it is
        return answer


def grade_answer_mathd(given_answer: str, ground_truth: str) -> bool:
    gt, given = mathd_normalize_answer(ground_truth), mathd_normalize_answer(given_answer)
    return gt is not None and gt == given


# ------------------------------------------------------------------------------------------- sympy equivalence
_UNITS = ["degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
          "year", "foot", "feet", "inch", "yard", "liter"]


def _latex_to_text(expr: str) -> str:
    """A plain-text reading of simple LaTeX (fractions, roots, products, pi) for sympy."""
    e = expr
    for _ in range(4):
        e = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", e)
        e = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", e)
        e = re.sub(r"\\sqrt\[([^{}\]]*)\]\{([^{}]*)\}", r"(\2)^(1/(\1))", e)
    e = e.replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*").replace("\\infty", "oo")
    e = e.replace("{", "(").replace("}", ")").replace("\\", "")
    return e


def _normalize(expr: Optional[str]) -> Optional[str]:
    if expr is None:
        return None
    m = re.fullmatch(r"\\text\{(.*)\}", expr)
    e = m.group(1) if m else expr
    for a, b in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , "),
                 ("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        e = e.replace(a, b)
    for unit in _UNITS:
        e = re.sub(rf"{unit}(es)?(s)? *(\^[0-9]+)?", "", e)
    e = re.sub(r"\^ *\\circ", "", e)
    if e.startswith("{") and e.endswith("}"):
        e = e[1:-1]
    e = re.sub(r",\\! *", "", e)
    if re.fullmatch(r"-?[\d,]+(\.\d+)?", e) and "," in e and re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", e):
        e = e.replace(",", "")
    if "\\" in e:
        e = _latex_to_text(e)
    e = re.sub(r"- *", "-", e).replace(" ", "")
    e = re.sub(r"(\d+)\.0+$", r"\1", e)
    return e.lower()


def _is_frac(expr: str) -> bool:
    return bool(re.fullmatch(r"-?\(?\d+\)?/\(?\d+\)?", expr))


def _str_is_int(x: str) -> bool:
    try:
        v = float(x.replace(",", ""))
        return abs(v - round(v)) <= 1e-7
    except ValueError:
        return False


def _split_tuple(expr: str) -> list[str]:
    if len(expr) > 2 and expr[0] in "([" and expr[-1] in ")]" and "," in expr:
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def _sympy_equal(gt: str, given: str) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    tr = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
    try:
        a = sympy_parser.parse_expr(gt.replace("^", "**"), transformations=tr)
        b = sympy_parser.parse_expr(given.replace("^", "**"), transformations=tr)
        return sympy.simplify(a - b) == 0
    except Exception:
        return False


def grade_answer_sympy(given_answer: str, ground_truth: str) -> bool:
    gt, given = _normalize(ground_truth), _normalize(given_answer)
    if gt is None or given is None:
        return False
    if gt == given:
        return True
    if not given:
        return False
    gt_items, given_items = _split_tuple(gt), _split_tuple(given)
    if len(gt_items) != len(given_items) or (len(gt_items) > 1 and (gt[0] != given[0] or gt[-1] != given[-1])):
        return False
    for g, h in zip(gt_items, given_items):
        if _is_frac(g) and _is_frac(h) or _is_frac(g) and _str_is_int(h):
            ok = g == h        # a fraction is graded as written (2/4 is not 1/2)
        elif _str_is_int(g) != _str_is_int(h):
            ok = False
        else:
            ok = _sympy_equal(g, h)
        if not ok:
            return False
    return True


def grade_answer_verl(solution_str: str, ground_truth: str) -> bool:
    if not ground_truth:
        return False
    if "\\boxed" in ground_truth:
        ground_truth = extract_answer(ground_truth)
    given = extract_answer(solution_str)
    if given is None or ground_truth is None:
        return False
    return grade_answer_mathd(given, ground_truth) or grade_answer_sympy(given, ground_truth)

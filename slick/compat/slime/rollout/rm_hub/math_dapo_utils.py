"""slime's ``rm_hub.math_dapo_utils``: DAPO's scorer (``rm_type=dapo``), written for slick after its published
behaviour.

- ``last_boxed_only_string`` (``\\boxed{`` only) and ``remove_boxed``, which raises ``AssertionError("box error:
  ...")`` on anything that is not a box (math_utils' returns None);
- ``normalize_final_answer``: Minerva's normalisation: the text after the last ``=``, articles, spaces, ``\\$``
  and unit words removed, ``\\text{}``/``\\textbf{}``/``\\overline{}``/``\\boxed{}`` unwrapped, ``frac12`` and
  ``sqrt2`` braced, end-of-text markers dropped, thousands separators of integers removed;
- ``is_correct_minerva``: the last ``Answer: ...`` line, normalised, equals the normalised ground truth
  (``[INVALID]`` without one); ``is_correct_strict_box``: the last box of the final 100 characters equals the
  ground truth (1, else -1);
- ``verify`` picks one (``strict_box_verify``); ``compute_score`` verifies the last 300 characters and returns
  ``{"score": 1.0 or -1.0, "acc": bool, "pred": str}``.
"""
from __future__ import annotations

import re
from typing import Optional

from slick.compat.slime.rollout.rm_hub.math_utils import through_closing_brace

_REPLACE = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
_DROP = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
         "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
         "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
         "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
         ",\\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>"]
ANSWER = r"(?i)Answer\s*:\s*([^\n]+)"


def last_boxed_only_string(string: str) -> Optional[str]:
    start = string.rfind("\\boxed{")
    return None if start < 0 else through_closing_brace(string, start)


def remove_boxed(s: str) -> str:
    head = "\\boxed{"
    assert s[:len(head)] == head, f"box error: {s}"
    assert s[-1] == "}", f"box error: {s}"
    return s[len(head):-1]


def normalize_final_answer(final_answer: str) -> str:
    a = final_answer.split("=")[-1]
    for before, after in _REPLACE:
        a = a.replace(before, after)
    for expr in _DROP:
        a = a.replace(expr, "")
    a = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$", a)
    for macro in ("text", "textbf", "overline"):
        a = re.sub(rf"(\\{macro}\{{)(.*?)(\}})", r"\2", a)
    a = re.sub(r"(\\boxed\{)(.*)(\})", r"\2", a)
    a = re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", a)
    a = re.sub(r"(sqrt)([^{])", r"sqrt{\2}", a)
    a = a.replace("$", "")
    if a.replace(",", "").isdigit():
        a = a.replace(",", "")
    return a.strip()


def is_correct_minerva(solution_str: str, gt: str, gt_need_extract: bool = False,
                       answer_pattern: str = ANSWER) -> tuple[bool, str]:
    found = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    gt = normalize_final_answer(remove_boxed(last_boxed_only_string(gt)) if gt_need_extract else gt)
    return pred == gt, pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: Optional[list] = None) -> tuple[int, Optional[str]]:
    tail = pred[pause_tokens_index[-1] - 100:] if pause_tokens_index is not None and len(pause_tokens_index) == 4 \
        else pred[-100:]
    box = last_boxed_only_string(tail)
    extracted = remove_boxed(box) if box is not None else None
    return (1 if extracted == gt else -1), extracted


def verify(solution_str: str, answer: str, strict_box_verify: bool = False,
           pause_tokens_index: Optional[list] = None) -> tuple[bool, Optional[str]]:
    if strict_box_verify:
        score, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, pred
    return is_correct_minerva(solution_str, answer)


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  pause_tokens_index: Optional[list] = None) -> dict:
    correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}

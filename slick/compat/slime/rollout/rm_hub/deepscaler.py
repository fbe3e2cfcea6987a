"""slime's ``rm_hub.deepscaler``: the answer is the last box of the text after the reasoning (after the last
``</think>``, else after the first ``###Response``); no marker, no box or an empty label scores 0; the label (a
string or a number, itself possibly boxed) is matched by ``grade_answer_mathd`` or ``grade_answer_sympy``: 1 or 0."""
from __future__ import annotations

from slick.compat.slime.rollout.rm_hub.math_utils import extract_answer, grade_answer_mathd, grade_answer_sympy


def get_deepscaler_rule_based_reward(response: str, label) -> int:
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0
    given = extract_answer(solution)
    if given is None or label == "":
        return 0
    assert isinstance(label, (str, float, int)), f"deepscaler labels are strings or numbers, got {type(label)}"
    truth = str(label)
    if "\\boxed" in truth:
        truth = extract_answer(truth)
        if truth is None:
            return 0
    return int(grade_answer_mathd(given, truth) or grade_answer_sympy(given, truth))

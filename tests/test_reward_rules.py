"""Rule rewards scored by value: hand-written correct, wrong and malformed answers."""
import json

import pytest

from slick.reward import builtin_score, get_score_fn, last_boxed
from slick.reward import countdown, gsm8k, text
from slick.reward import math as math_rm

# ---------------------------------------------------------------- boxed extraction

@pytest.mark.parametrize("response, expected", [
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\frac{\\sqrt{2}}{\\left\\{3\\right\\}}}", "\\frac{\\sqrt{2}}{\\left\\{3\\right\\}}"),
    ("first \\boxed{3} then \\boxed{ 5 }", "5"),
    ("\\boxed{\\boxed{7}} and earlier", "\\boxed{7}"),
    ("\\fbox{x+1}", "x+1"),
    ("a set \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("done \\boxed{3} then truncated \\boxed{\\frac{1}{", "3"),
    ("no box here", None),
    ("\\boxed{unclosed", None),
    ("", None),
])
def test_last_boxed(response, expected):
    assert last_boxed(response) == expected


# ---------------------------------------------------------------- math

@pytest.mark.parametrize("response, label, expected", [
    ("So the answer is \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.5}", "1/2", 1.0),
    ("\\boxed{\\dfrac{2}{4}}", "$\\frac{1}{2}$", 1.0),
    ("\\boxed{x^2+1}", "1+x^2", 1.0),
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),
    ("The answer is 4.", "4", 1.0),                      # no box: math-verify reads the text
    ("first \\boxed{3}, final answer \\boxed{4}", "4", 1.0),   # the last box wins
    ("first \\boxed{4}, final answer \\boxed{3}", "4", 0.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{2}", 0.0),
    ("\\boxed{0.6}", "\\frac{1}{2}", 0.0),
    ("I don't know", "4", 0.0),
    ("", "4", 0.0),
    ("\\boxed{}", "4", 0.0),
])
def test_math(response, label, expected):
    assert math_rm.score(response, label, {}) == expected


def test_math_unparseable_label_raises():
    with pytest.raises(ValueError, match="label"):
        math_rm.score("\\boxed{1}", "", {})
    with pytest.raises(ValueError, match="label"):
        math_rm.score("\\boxed{1}", None, {})


# ---------------------------------------------------------------- gsm8k

@pytest.mark.parametrize("response, label, expected", [
    ("3 + 4 = 7", "7", 1.0),
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "#### 72", 1.0),
    ("#### 72 (I double checked 3 times)", "72", 1.0),       # number after #### wins over the last one
    ("The total is $1,234.50.", "Some working\n#### 1234.5", 1.0),
    ("It is 42.0", 42, 1.0),
    ("costs .5 dollars", 0.5, 1.0),
    ("the answer is -3", "-3", 1.0),
    ("3 + 4 = 7, no wait 8", "7", 0.0),
    ("#### 71", "72", 0.0),
    ("no digits at all", "7", 0.0),
    ("", "7", 0.0),
])
def test_gsm8k(response, label, expected):
    assert gsm8k.score(response, label, {}) == expected


def test_gsm8k_label_without_number_raises():
    with pytest.raises(ValueError, match="no number in label"):
        gsm8k.score("7", "seven", {})


# ---------------------------------------------------------------- exact / f1

def test_exact():
    assert text.score_exact("  Paris \n", "Paris", {}) == 1.0
    assert text.score_exact("paris", "Paris", {}) == 0.0
    assert text.score_exact("Lyon", ["Paris", "Lyon"], {}) == 1.0
    assert text.score_exact("", "Paris", {}) == 0.0
    assert text.score_exact("7", 7, {}) == 1.0


def test_f1_hand_computed():
    # pred tokens [cat, sat, on, mat] vs ref [cat, sat] ("the" dropped): common 2,
    # precision 2/4, recall 2/2 -> F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    assert text.score_f1("The cat sat on the mat.", "the cat sat", {}) == pytest.approx(2 / 3)
    assert text.score_f1("A Cat, sat!", "cat sat", {}) == 1.0
    assert text.score_f1("dog", "cat sat", {}) == 0.0
    assert text.score_f1("", "cat", {}) == 0.0
    # best of several references: "new york city" vs "new york" -> P 2/3, R 1 -> 0.8
    assert text.score_f1("New York City", ["Boston", "new york"], {}) == pytest.approx(0.8)


# ---------------------------------------------------------------- countdown

TASK = {"target": 50, "numbers": [4, 5, 6]}


@pytest.mark.parametrize("response, expected", [
    ("(6+4)*5", 1.0),
    ("Let me think.\n<answer>5 * (6 + 4)</answer>", 1.0),
    ("<answer>(6+4)*5 = 50</answer>", 1.0),
    ("reasoning...\n(6+4)×5\n", 1.0),                 # last line, unicode times
    ("<answer>6+4*5</answer>", 0.0),                  # uses each once but equals 26
    ("(6+6)*5", 0.0),                                 # reuses 6, drops 4
    ("(6+4)*5*1", 0.0),                               # extra number
    ("(6+4)*5-0", 0.0),
    ("-(4-6)*5*5", 0.0),                              # unary minus and reuse
    ("(6+4)**1*5", 0.0),                              # power not allowed
    ("(6.0+4)*5", 0.0),                               # floats not allowed
    ("(6+4)/(5-5)", 0.0),                             # division by zero
    ("6 4 5", 0.0),                                   # not an expression
    ("", 0.0),
])
def test_countdown(response, expected):
    assert countdown.score(response, TASK, {}) == expected


def test_countdown_exact_fractions():
    # in floats (1/10 + 2/10) * 10 is 3.0000000000000004; in fractions it is exactly 3
    assert (1 / 10 + 2 / 10) * 10 != 3
    assert countdown.score("(1/10 + 2/10)*10", {"target": 3, "numbers": [1, 2, 10, 10, 10]}, {}) == 1.0
    assert countdown.score("6/(3/2)", {"target": 4, "numbers": [2, 3, 6]}, {}) == 1.0
    # 6 / (4 / 5) = 7.5, not 7
    assert countdown.score("6/(4/5)", {"target": 7, "numbers": [4, 5, 6]}, {}) == 0.0


def test_countdown_never_executes_code(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('pathlib').Path({str(marker)!r}).write_text('x')"
    assert countdown.score(payload, TASK, {}) == 0.0
    assert countdown.score(f"<answer>{payload}</answer>", TASK, {}) == 0.0
    assert countdown.score("(lambda: 50)()", TASK, {}) == 0.0
    assert not marker.exists()


def test_countdown_label_forms():
    assert countdown.score("(6+4)*5", json.dumps(TASK), {}) == 1.0
    assert countdown.score("(6+4)*5", None, {"target": 50, "numbers": [6, 5, 4]}) == 1.0
    with pytest.raises(ValueError, match="target"):
        countdown.score("(6+4)*5", {"numbers": [4, 5, 6]}, {})
    with pytest.raises(ValueError, match="numbers"):
        countdown.score("(6+4)*5", {"target": 50, "numbers": "4 5 6"}, {})
    with pytest.raises(ValueError, match="not JSON"):
        countdown.score("(6+4)*5", "target 50", {})


# ---------------------------------------------------------------- boxed_<type> and registry

def test_boxed_types():
    assert builtin_score("boxed_exact", "so \\boxed{Paris}", "Paris") == 1.0
    assert builtin_score("boxed_exact", "Paris", "Paris") == 0.0            # no box -> 0
    assert builtin_score("boxed_gsm8k", "I guess 7? \\boxed{8}", "8") == 1.0
    assert builtin_score("boxed_gsm8k", "8 \\boxed{7}", "8") == 0.0
    assert builtin_score("boxed_countdown", "\\boxed{(6+4)*5}", TASK) == 1.0
    assert builtin_score("boxed_math", "\\boxed{\\frac{1}{2}} then 0.7", "0.5") == 1.0


def test_unknown_type():
    with pytest.raises(ValueError, match="unknown reward type 'nope'"):
        get_score_fn("nope")
    with pytest.raises(ValueError, match="boxed_remote_rm"):
        get_score_fn("boxed_remote_rm")

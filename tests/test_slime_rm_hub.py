"""slime.rollout.rm_hub as plug-ins import it (slick/compat/slime/rollout/rm_hub), checked against the cases of
slime's own unit tests (THUDM/slime tests/test_rm_math.py, test_rm_math_dapo.py, test_rm_deepscaler.py at 624b824a:
inputs and expected outputs as facts) and slime's async_rm dispatch."""
import asyncio
from argparse import Namespace

import pytest

from slick.compat.finder import install

install()    # `slime` resolves to slick's stand-in, as for a plug-in slick loads
from slime.rollout import rm_hub  # noqa: E402
from slime.rollout.rm_hub import math_dapo_utils as dapo  # noqa: E402
from slime.rollout.rm_hub import math_utils as mu  # noqa: E402
from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward as deepscaler  # noqa: E402
from slime.utils.types import Sample  # noqa: E402


def test_boxed_extraction():
    assert mu.last_boxed_only_string(r"first attempt \boxed{wrong}, final \boxed{42}") == r"\boxed{42}"
    assert mu.last_boxed_only_string(r"answer: \boxed{\frac{1}{2}}") == r"\boxed{\frac{1}{2}}"
    assert mu.last_boxed_only_string(r"answer: \fbox{7}") == r"\fbox{7}"
    assert mu.last_boxed_only_string("plain text, no box") is None
    assert mu.last_boxed_only_string(r"start \boxed{never closes") is None
    assert mu.remove_boxed(r"\boxed{x+1}") == "x+1" and mu.remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert mu.remove_boxed("not boxed at all") is None and mu.remove_boxed(None) is None
    assert mu.extract_boxed_answer(r"Solution: \boxed{42}") == "42" and mu.extract_answer("just 42") is None


@pytest.mark.parametrize("raw,expected", [
    (r"\frac12", r"\frac{1}{2}"), (r"\tfrac{1}{2}", r"\frac{1}{2}"), (r"\left(1\right)", "(1)"),
    (r"45^{\circ}", "45"), (r"45^\circ", "45"), (".7", "0.7"), ("0.5", r"\frac{1}{2}"), (".5", r"\frac{1}{2}"),
    ("3/4", r"\frac{3}{4}"), ("1 + 1", "1+1"),
])
def test_strip_string(raw, expected):
    assert mu._strip_string(raw) == expected


def test_graders():
    assert mu.mathd_normalize_answer(r"\text{42}") == "42" and mu.mathd_normalize_answer(None) is None
    for given, gt in [(r"\frac{1}{2}", "0.5"), (r"\frac12", r"\frac{1}{2}"), (r"45^\circ", "45"), ("3/4", r"\frac{3}{4}")]:
        assert mu.grade_answer_mathd(given, gt) is True
    assert mu.grade_answer_mathd("42", "43") is False
    assert mu.grade_answer_sympy("x+1", "1+x") is True
    assert mu.grade_answer_sympy(r"\frac{2}{4}", r"\frac{1}{2}") is False
    assert mu.grade_answer_verl(r"answer: \boxed{42}", r"\boxed{42}") is True
    assert mu.grade_answer_verl("just 42", "42") is False and mu.grade_answer_verl(r"\boxed{42}", "") is False
    assert rm_hub.grade_answer_verl is mu.grade_answer_verl


def test_deepscaler():
    assert deepscaler(r"Let me reconsider. \boxed{99}</think>Final: \boxed{42}", "42") == 1
    assert deepscaler(r"Scratch work \boxed{wrong}###Response\boxed{42}", "42") == 1
    assert deepscaler(r"\boxed{42}", "42") == 0 and deepscaler("plain</think>no box here", "42") == 0
    assert deepscaler(r"</think>\boxed{42}", "") == 0 and deepscaler(r"</think>\boxed{42}", 42) == 1
    assert deepscaler(r"</think>\boxed{42}", r"\boxed{42}") == 1 and deepscaler(r"</think>\boxed{43}", "42") == 0
    assert deepscaler(r"</think>\boxed{\frac{1}{2}}", "0.5") == 1


@pytest.mark.parametrize("raw,expected", [
    ("x = 42", "42"), ("an answer", "answer"), ("42 square", "42"), ("100 dollars", "100"), (r"\text{hello}", "hello"),
    (r"\boxed{42}", "42"), ("1,234,567", "1234567"), ("a b c", "bc"), ("42<|endoftext|>", "42"), ("42<|im_end|>", "42"),
])
def test_dapo_normalize(raw, expected):
    assert dapo.normalize_final_answer(raw) == expected


def test_dapo_scoring():
    assert dapo.last_boxed_only_string(r"\boxed{first}, then \boxed{42}") == r"\boxed{42}"
    assert dapo.last_boxed_only_string(r"\boxed{\frac{1}{2}}") == r"\boxed{\frac{1}{2}}"
    assert dapo.last_boxed_only_string("no box") is None and dapo.last_boxed_only_string(r"\boxed{never closes") is None
    assert dapo.remove_boxed(r"\boxed{42}") == "42"
    with pytest.raises(AssertionError, match="box error"):
        dapo.remove_boxed("not boxed")
    assert dapo.is_correct_strict_box(r"long preamble … \boxed{42}", "42") == (1, "42")
    assert dapo.is_correct_strict_box(r"\boxed{43}", "42") == (-1, "43")
    assert dapo.is_correct_strict_box("plain 42", "42") == (-1, None)
    assert dapo.is_correct_minerva("Long solution. Answer: 42", "42") == (True, "42")
    assert dapo.is_correct_minerva("Answer: 41 was a wrong guess.\nAnswer: 42", "42")[0] is True
    assert dapo.is_correct_minerva("just a number 42", "42")[0] is False
    assert dapo.verify(r"\boxed{42}", "42", strict_box_verify=True) == (True, "42")
    assert dapo.verify("Answer: 42", "42")[0] is True
    assert dapo.compute_score(r"\boxed{42}", "42", strict_box_verify=True) == {"score": 1.0, "acc": True, "pred": "42"}
    assert dapo.compute_score(r"\boxed{43}", "42", strict_box_verify=True)["score"] == -1.0
    assert dapo.compute_score(r"\boxed{42}" + " filler" * 60, "42", strict_box_verify=True)["score"] == -1.0


def test_async_rm_dispatch():
    def rm(rm_type, response, label, metadata=None):
        sample = Sample(prompt="p", response=response, label=label, metadata=metadata or {})
        return asyncio.run(rm_hub.async_rm(Namespace(custom_rm_path=None, rm_type=rm_type), sample))
    assert rm("deepscaler", r"</think>\boxed{42}", "42") == 1
    assert rm("math", r"so \boxed{0.5}", r"\frac{1}{2}") == 1 and rm("math", r"\boxed{3}", "4") == 0
    assert rm("dapo", "Answer: 7", "7") == {"score": 1.0, "acc": True, "pred": "7"}
    assert rm(None, r"</think>\boxed{5}", "5", {"rm_type": "deepscaler"}) == 1       # the sample's own type first
    assert rm("boxed_dapo", r"Answer: 6 \boxed{Answer: 7}", "7")["pred"] == "7"      # graded on the box
    with pytest.raises(NotImplementedError, match="slick's --rm-type gpqa"):
        rm("gpqa", "A", "A")
    samples = [Sample(prompt="p", response=r"</think>\boxed{%d}" % i, label="1") for i in range(3)]
    args = Namespace(custom_rm_path=None, rm_type="deepscaler")
    assert asyncio.run(rm_hub.batched_async_rm(args, samples)) == [0, 1, 0]

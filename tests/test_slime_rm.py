"""slime's rm-hub types in slick (slick/reward/slime_rm.py): deepscaler, dapo, gpqa scored as slime's docs describe;
ifbench refused by name."""
import pytest

from slick.config import ConfigError, Config
from slick.configure.validate import validate_config
from slick.reward.errors import LabelError
from slick.reward.registry import get_judge_fn, get_score_fn


@pytest.mark.parametrize("response,label,score", [
    ("<think>2+2 is 4, or \\boxed{5}?</think> So \\boxed{4}.", "4", 1.0),
    ("<think>...</think> The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),     # math equivalence
    ("<think>...</think> \\boxed{5}", "4", 0.0),
    ("No reasoning markers: \\boxed{4}", "4", 0.0),                               # nothing after </think>
    ("<think>\\boxed{4}</think> no box after thinking", "4", 0.0),
    ("###Response the result is \\boxed{12}", 12, 1.0),
])
def test_deepscaler(response, label, score):
    assert get_score_fn("deepscaler")(response, label, {}) == score


@pytest.mark.parametrize("response,label,score", [
    ("Let me compute.\nAnswer: 42", "42", 1.0),
    ("work\nanswer: $1,024$.", "1024", 1.0),
    ("Answer: 41\nwait, Answer: \\boxed{42}", "42.0", 1.0),                     # the last Answer line counts
    ("Answer: 41", "42", -1.0),
    ("no answer line at all: 42", "42", -1.0),
])
def test_dapo(response, label, score):
    assert get_score_fn("dapo")(response, label, {}) == score


def test_dapo_label_must_be_an_integer():
    with pytest.raises(LabelError, match="dapo reward: label 'x'"):
        get_score_fn("dapo")("Answer: 1", "x", {})


@pytest.mark.parametrize("response,label,metadata,score", [
    ("<think>maybe A</think> The answer is C.", "C", {}, 1.0),
    ("I pick (B) is correct", "B", {}, 1.0),
    ("Final answer: D", "C", {}, 0.0),
    ("Therefore B", "Paris", {"choices": ["Rome", "Paris", "Oslo"]}, 1.0),     # label is a choice's text
    ("Answer: A", "Z", {"correct_letter": "A"}, 1.0),
    ("Answer: E", "D", {"choices": ["w", "x", "y", "z"]}, 0.0),                  # E is no valid letter of 4 choices
])
def test_gpqa(response, label, metadata, score):
    assert get_score_fn("gpqa")(response, label, metadata) == score
    assert get_judge_fn("gpqa")(response, label, metadata).score == score


def test_boxed_variant_and_ifbench_refused():
    assert get_score_fn("boxed_dapo")("\\boxed{Answer: 7}", "7", {}) == 1.0
    with pytest.raises(ConfigError, match="--rm-type ifbench: not offered .*IFBench.*--custom-rm-path"):
        validate_config(Config.from_flat(dict(rm_type="ifbench")), check_files=False)
    validate_config(Config.from_flat(dict(rm_type="deepscaler")), check_files=False)

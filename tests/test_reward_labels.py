"""Unusable labels are reported (failure reward, reward_error naming the label's type, counted in
reward/failures and reward/bad_labels), never silently scored 0.0."""
import asyncio

import pytest

from slick.config import Config
from slick.reward import LabelError, RewardHub, builtin_score
from slick.types import Sample

DICT_LABEL = {"answer": "7"}


def score_one(rm_type, response, label, metadata=None):
    hub = RewardHub(Config.from_flat(dict(rm_type=rm_type, rm_failure_reward=-1.0, rm_timeout=10.0)))
    s = Sample(index=0, response=response, label=label, metadata=dict(metadata or {}))

    async def go():
        try:
            await hub.score_group([s])
        finally:
            await hub.close()
    asyncio.run(go())
    return s, hub.stats()


@pytest.mark.parametrize("rm_type, response, label, error", [
    ("math", "\\boxed{7}", DICT_LABEL, "math reward: label must be a string or a number, got dict: \"{'answer': '7'}\""),
    ("math", "\\boxed{7}", None, "math reward: label must be a string or a number, got NoneType: 'None'"),
    ("math", "\\boxed{7}", ["7"], "math reward: label must be a string or a number, got list"),
    ("gsm8k", "7", DICT_LABEL, "gsm8k reward: label must be a number or a string, got dict"),
    ("gsm8k", "7", None, "gsm8k reward: label must be a number or a string, got NoneType"),
    ("gsm8k", "7", [7], "gsm8k reward: label must be a number or a string, got list"),
    ("gsm8k", "1", True, "gsm8k reward: label must be a number or a string, got bool"),
    ("exact", "7", DICT_LABEL, "text (exact/f1) reward: label must be a string, a number, or a non-empty list "
                               "of them, got dict"),
    ("exact", "7", None, "text (exact/f1) reward: label must be a string, a number, or a non-empty list "
                         "of them, got NoneType"),
    ("exact", "7", [], "got list: '[]'"),
    ("exact", "7", ["7", {"a": 1}], "got list: \"['7', {'a': 1}]\""),
    ("f1", "seven", DICT_LABEL, "text (exact/f1) reward: label must be a string, a number, or a non-empty list "
                                "of them, got dict"),
    ("f1", "seven", [["seven"]], "got list"),
    ("countdown", "(6+4)*5", [50, 4, 5, 6], "countdown reward: label must be a dict like"),
    ("countdown", "(6+4)*5", "50", "countdown reward: label must be a dict like {\"target\": 50, "
                                   "\"numbers\": [4, 5, 6]}, its JSON text, or None, got int: '50'"),
    ("countdown", "(6+4)*5", {"numbers": [4, 5, 6]}, "countdown needs 'target' and 'numbers'"),
    ("countdown", "(6+4)*5", None, "countdown needs 'target' and 'numbers'"),
    # boxed_<type> checks the label even when the response has no box
    ("boxed_math", "no box here", DICT_LABEL, "math reward: label must be a string or a number, got dict"),
    ("boxed_gsm8k", "no box here", DICT_LABEL, "gsm8k reward: label must be a number or a string, got dict"),
    ("boxed_exact", "no box here", DICT_LABEL, "got dict"),
    ("boxed_f1", "\\boxed{seven}", DICT_LABEL, "got dict"),
    ("boxed_countdown", "no box here", [1], "countdown reward: label must be a dict like"),
])
def test_unusable_label_is_a_counted_failure(rm_type, response, label, error):
    s, st = score_one(rm_type, response, label)
    assert s.reward == -1.0
    assert s.metadata["reward_error"].startswith("LabelError: ")
    assert error in s.metadata["reward_error"]
    assert st["reward/failures"] == 1 and st["reward/bad_labels"] == 1 and st["reward/nonfinite"] == 0


@pytest.mark.parametrize("rm_type, response, label, expected", [
    ("math", "\\boxed{7}", 7, 1.0),
    ("math", "\\boxed{0.5}", 0.5, 1.0),
    ("gsm8k", "7", 7, 1.0),
    ("exact", "7", 7, 1.0),
    ("exact", "7", ["6", 7], 1.0),
    ("f1", "seven", ("six", "seven"), 1.0),
    ("countdown", "(6+4)*5", '{"target": 50, "numbers": [4, 5, 6]}', 1.0),
    ("boxed_exact", "no box here", "7", 0.0),
    ("boxed_countdown", "no box", None, 0.0),      # label None, task in metadata (below)
])
def test_usable_labels_still_score(rm_type, response, label, expected):
    meta = {"target": 50, "numbers": [4, 5, 6]}
    s, st = score_one(rm_type, response, label, meta)
    assert s.reward == expected and "reward_error" not in s.metadata
    assert st["reward/failures"] == 0 and st["reward/bad_labels"] == 0


def test_scorers_raise_label_error_directly():
    for rm_type in ("math", "gsm8k", "exact", "f1", "countdown"):
        with pytest.raises(LabelError, match="label"):
            builtin_score(rm_type, "7", [[1]])
    assert issubclass(LabelError, ValueError)


def test_response_problems_are_not_label_errors():
    # a wrong or unparseable *response* is a plain 0.0, not a failure
    for rm_type, response, label in [("math", "no idea", "7"), ("gsm8k", "no digits", "7"),
                                     ("countdown", "6 4 5", {"target": 50, "numbers": [4, 5, 6]})]:
        s, st = score_one(rm_type, response, label)
        assert s.reward == 0.0 and st["reward/failures"] == 0

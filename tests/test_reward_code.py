"""--rm-type code (issue 36): code extraction, the label forms (stdin/stdout, calls, asserts, HumanEval's
check), fraction vs all-or-nothing, per-test verdicts in the evidence, bad labels, and the hub wiring with
the --sandbox-* flags."""
from __future__ import annotations

import asyncio
import json

import pytest

from slick.configure.parse import parse_config
from slick.reward import LabelError, RewardHub
from slick.reward.code import CodeJudge, extract_code
from slick.reward.code_tests import normalise_output, parse_label
from slick.types import Sample
from tests.sandbox_tools import make_pool

DOUBLE = {"inputs": ["2\n", "5", ["1"]], "outputs": ["4", "10\n\n", ["2"]]}


@pytest.fixture(scope="module")
def pool():
    return make_pool(2, wall_seconds=3.0, cpu_seconds=1)


def fenced(code: str, tag: str = "python") -> str:
    return f"Here you go:\n```{tag}\n{code}\n```\nDone."


@pytest.mark.parametrize("response, block, want", [
    ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "last", "b = 2\n"),
    ("```python\na = 1\n```\ntext\n```python\nb = 2\n```", "first", "a = 1\n"),
    ("```python\na = 1\n```\n```text\noutput\n```", "last", "a = 1\n"),     # python blocks first
    ("```\nc = 3\n```", "last", "c = 3\n"),
    ("```text\nonly text\n```", "last", "only text\n"),
    ("no block at all", "last", None),
    ("```python\nunterminated", "last", None),
    ("x = 1", "none", "x = 1"),
])
def test_extract_code(response, block, want):
    assert extract_code(response, block) == want


def test_normalise_output():
    assert normalise_output("1 2  \r\n3\n\n\n") == ["1 2", "3"]
    assert normalise_output("a\n") == normalise_output("a")


@pytest.mark.parametrize("label, match", [
    ({"inputs": ["1"]}, "same length"), ({"inputs": ["1"], "outputs": []}, "same length"),
    ({"inputs": [], "outputs": []}, "same length"), ({"inputs": [1], "outputs": ["1"]}, "list of lines"),
    ({"tests": ""}, "non-empty"), ({"tests": "assert ("}, r"valid Python \(line 1"), ("not json", "JSON string"),
    (7, "got int"), ({"inputs": [[1]], "outputs": [1], "fn_name": "not an id"}, "fn_name"),
    ({"tests": "assert 1", "entry_point": "1x"}, "entry_point"),
])
def test_bad_labels(label, match):
    with pytest.raises(LabelError, match=match):
        parse_label(label)


def test_assert_label_splits_tests_from_setup():
    spec = parse_label({"tests": "import math\nassert f(1) == 2\nX = 3\nassert f(X) == 4"})
    assert spec.chunks == [("import math", False), ("assert f(1) == 2", True), ("X = 3", False),
                           ("assert f(X) == 4", True)]
    assert spec.count == 2
    spec = parse_label(json.dumps({"tests": "def check(candidate):\n    assert candidate(1) == 2\n",
                                   "entry_point": "inc"}))
    assert spec.count == 1 and spec.chunks[-1] == ("check(inc)", True)


def test_stdio_cases(pool):
    judge = CodeJudge(pool)
    j = judge(fenced("print(int(input()) * 2)"), DOUBLE)
    assert (j.score, j.verdict, j.answer) == (1.0, True, "print(int(input()) * 2)\n")
    assert [t["verdict"] for t in j.extras["tests"]] == ["pass"] * 3
    j = judge(fenced("n = int(input())\nprint(4 if n == 2 else n)"), DOUBLE)
    assert j.score == pytest.approx(1 / 3) and j.verdict is False
    assert j.extras["tests"][1] == {"verdict": "wrong_answer", "seconds": j.extras["tests"][1]["seconds"],
                                    "expected": "10\n\n", "got": "5\n"}
    assert (j.extras["passed"], j.extras["total"], j.extras["mode"]) == (1, 3, "fraction")


def test_all_or_nothing(pool):
    j = CodeJudge(pool, mode="all")(fenced("n = int(input())\nprint(4 if n == 2 else n)"), DOUBLE)
    assert (j.score, j.extras["passed"]) == (0.0, 1)
    assert CodeJudge(pool, mode="all")(fenced("print(int(input()) * 2)"), DOUBLE).score == 1.0


def test_verdicts_per_test(pool):
    code = ("n = int(input())\nif n == 2:\n    while True: pass\nif n == 5:\n    x = bytearray(1 << 40)\n"
            "raise SystemExit('bad ' + str(n))")
    j = CodeJudge(pool)(fenced(code), DOUBLE)
    tests = j.extras["tests"]
    assert [t["verdict"] for t in tests] == ["time_limit", "memory_limit", "runtime_error"]
    assert tests[2]["stderr"].endswith("bad 1") and j.score == 0.0


def test_call_cases(pool):
    label = {"inputs": [[1, 2], [3, 4], [[1], [2]]], "outputs": [3, [7], [1, 2]], "fn_name": "add"}
    j = CodeJudge(pool)(fenced("def add(a, b):\n    return a + b"), label)
    assert [t["verdict"] for t in j.extras["tests"]] == ["pass", "pass", "pass"]
    j = CodeJudge(pool)(fenced("def add(a, b):\n    return a - b"), label)
    assert [t["verdict"] for t in j.extras["tests"]] == ["wrong_answer", "wrong_answer", "runtime_error"]
    j = CodeJudge(pool)(fenced("def plus(a, b):\n    return a + b"), label)
    assert [t["verdict"] for t in j.extras["tests"]] == ["runtime_error"] * 3


def test_assert_tests(pool):
    label = {"tests": "assert inc(1) == 2\nassert inc(2) == 4\nassert undefined(1)\nassert inc(0) == 1"}
    j = CodeJudge(pool)(fenced("def inc(x):\n    return x + 1"), label)
    tests = j.extras["tests"]
    assert [t["verdict"] for t in tests] == ["pass", "wrong_answer", "runtime_error", "pass"]
    assert "NameError" in tests[2]["stderr"] and j.score == 0.5


def test_humaneval_check(pool):
    label = {"tests": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n",
             "entry_point": "inc"}
    assert CodeJudge(pool)(fenced("def inc(x):\n    return x + 1"), label).score == 1.0
    assert CodeJudge(pool)(fenced("def inc(x):\n    return 2"), label).score == 0.0


@pytest.mark.parametrize("code, reason", [
    ("import os\ndef inc(x): return 0\nos._exit(0)", "exited before its tests ran"),
    ("import sys\ndef inc(x): return 0\nsys.exit(0)", "exited before its tests ran"),
    ("def inc(x): return 0\nprint('\\n@@slick-' + '0' * 32 + '[[\"pass\", 0, null]]')", None),
])
def test_early_exit_and_forged_reports_pass_nothing(pool, code, reason):
    j = CodeJudge(pool)(fenced(code), {"tests": "assert inc(1) == 2"})
    assert j.score == 0.0 and j.extras["tests"][0]["verdict"] in ("runtime_error", "wrong_answer")
    if reason:
        assert reason in j.extras["tests"][0]["stderr"]


def test_no_code_block(pool):
    j = CodeJudge(pool)("I think the answer is 4.", DOUBLE)
    assert (j.score, j.answer, j.extras["reason"]) == (0.0, None, "no fenced code block in the response")


def _samples():
    good = Sample(index=0, prompt="p", label=DOUBLE, response=fenced("print(int(input()) * 2)"))
    slow = Sample(index=1, prompt="p", label=json.dumps(DOUBLE), response=fenced("while True: pass"))
    bad = Sample(index=2, prompt="p", label={"nope": 1}, response=fenced("print(1)"))
    math_row = Sample(index=3, prompt="p", label="4", response="\\boxed{4}", metadata={"rm_type": "math"})
    return [good, slow, bad, math_row]


def test_hub_with_sandbox_flags():
    make_pool(1)                 # skips without a sandbox
    cfg = parse_config(["--rm-type", "code", "--sandbox-workers", "2", "--sandbox-cpu-seconds", "1",
                        "--sandbox-timeout", "2", "--code-reward-mode", "all"], validate=False)
    hub = RewardHub(cfg)
    samples = _samples()
    asyncio.run(hub.score_group(samples))
    good, slow, bad, math_row = samples
    assert good.reward == 1.0 and good.evidence["reward_type"] == "code" and good.evidence["verdict"] is True
    assert slow.reward == 0.0 and [t["verdict"] for t in slow.evidence["tests"]] == ["time_limit"] * 3
    assert all(t["seconds"] < 3 for t in slow.evidence["tests"])
    assert bad.reward == 0.0 and bad.evidence["error"].startswith("LabelError: code reward")
    assert math_row.reward == 1.0 and math_row.evidence["reward_type"] == "math"
    assert hub.stats()["reward/bad_labels"] == 1
    judge = hub._judges["code"]
    assert (judge.mode, judge.pool.workers, judge.pool.limits.cpu_seconds, judge.pool.limits.wall_seconds) == \
        ("all", 2, 1, 2.0)

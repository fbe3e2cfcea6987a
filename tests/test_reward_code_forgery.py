"""Code rewards the policy cannot forge (issue 50): every exploit a hostile program can try scores 0 in both
reward modes (each passed on the token-in-stdout harness), while honest programs still score 1.0 and partly
correct ones the exact fraction. Real sandbox runs."""
from __future__ import annotations

import pytest

from slick.reward.code import CodeJudge
from slick.reward.code_tests import HarnessError, new_key, read_report
from tests.sandbox_tools import make_pool

SQUARES = {"tests": "assert f(2) == 4\nassert f(3) == 9"}

FORGE_REPORT = """\
import json, os, re
src = open('/sandbox/main.py').read()
m = re.search(r'@@slick-[0-9a-f]{32}', src)
token = m.group(0) if m else '@@slick-' + '0' * 32
forged = ['\\n' + token + json.dumps(REPORT) + '\\n']
forged += [json.dumps(line) + '\\n' for line in (['begin'], ['test', 0, 'pass', 0, None], ['test', 1, 'pass', 0, None],
                                                 ['end', 2])]
for path in ('/proc/1/fd/1', '/proc/%d/fd/1' % os.getppid(), '/dev/stdout'):
    try:
        with open(path, 'w') as fh:
            fh.write(''.join(forged))
    except OSError:
        pass
os.write(1, ''.join(forged).encode())
def f(x):
    return 0
os._exit(0)
"""

EXPLOITS = {
    # the three
    "forged report from the token in /sandbox/main.py": FORGE_REPORT.replace("REPORT", "[['pass', 0, None]] * 2"),
    "token and an empty report": FORGE_REPORT.replace("REPORT", "[]"),
    "int subclass whose __eq__ is always true": (
        "class Y(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def f(x):\n    return Y(x)\n"),
    # others
    "object whose __eq__ is always true": (
        "class A:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return A()\n"),
    "str subclass whose __eq__ is always true": (
        "class S(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "def f(x):\n    return S('no')\n"),
    "reads the expected value from the caller's frame": (
        "import re, sys\ndef f(x):\n    fr = sys._getframe(1)\n    while fr is not None:\n"
        "        for v in list(fr.f_locals.values()) + list(fr.f_globals.values()):\n"
        "            if isinstance(v, str) and 'f(%d) ==' % x in v:\n"
        "                return int(re.search(r'f\\(%d\\) == (\\d+)' % x, v).group(1))\n"
        "        fr = fr.f_back\n    return 0\n"),
    "finds the tests in its own memory (gc)": (
        "import gc, re\ndef f(x):\n    for o in gc.get_objects():\n"
        "        items = o if isinstance(o, (list, tuple)) else []\n        for v in items:\n"
        "            s = v if isinstance(v, str) else ''\n            m = re.search(r'f\\(%d\\) == (\\d+)' % x, s)\n"
        "            if m:\n                return int(m.group(1))\n    return 0\n"),
    "patches the harness's json.dumps": (
        "import json\n_d = json.dumps\njson.dumps = lambda r, *a, **k: _d([['pass', 0, None] for _ in r] "
        "if isinstance(r, list) else r, *a, **k)\ndef f(x):\n    return 0\n"),
    "patches builtins.exec": "import builtins\nbuiltins.exec = lambda *a, **k: None\ndef f(x):\n    return 0\n",
    "kills its parent after forging": (
        FORGE_REPORT.replace("REPORT", "[['pass', 0, None]] * 2").replace("os._exit(0)",
                                                                      "os.kill(os.getppid(), 9)\nos._exit(0)")),
    "interrupts its parent": "import os, signal\nos.kill(os.getppid(), signal.SIGINT)\ndef f(x):\n    return 0\n",
}

SHADOW = {  # exploits through names the tests use
    "shadows a builtin the tests call": (
        {"tests": "assert abs(f(2) - 4) < 1e-9\nassert abs(f(3) - 9) < 1e-9"},
        "abs = lambda v: 0\ndef f(x):\n    return 0\n"),
    "fakes a standard module the tests use": (
        {"tests": "assert math.isclose(f(2), 4.0)\nassert math.isclose(f(3), 9.0)"},
        "import math\nclass _M:\n    def isclose(self, a, b):\n        return True\nmath = _M()\n"
        "def f(x):\n    return 0\n"),
    "StopIteration ends the tests' map early": (
        {"tests": "assert all(map(lambda x: f(x) == x * x, [2, 3]))\nassert all(f(x) == x * x for x in [4])"},
        "def f(x):\n    raise StopIteration\n"),
    "a bool-like object for truth tests": (
        {"tests": "assert is_square(4)\nassert is_square(9)"},
        "class T:\n    def __bool__(self):\n        return True\ndef is_square(x):\n    return T()\n"),
}


@pytest.fixture(scope="module")
def pool():
    return make_pool(2, wall_seconds=6.0, cpu_seconds=2)


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.mark.parametrize("mode", ["fraction", "all"])
@pytest.mark.parametrize("name", sorted(EXPLOITS))
def test_exploit_scores_zero(pool, name, mode):
    j = CodeJudge(pool, mode=mode)(fenced(EXPLOITS[name]), SQUARES)
    assert (j.score, j.extras["passed"], len(j.extras["tests"])) == (0.0, 0, 2), j.extras


@pytest.mark.parametrize("mode", ["fraction", "all"])
@pytest.mark.parametrize("name", sorted(SHADOW))
def test_shadowing_exploit_scores_zero(pool, name, mode):
    label, code = SHADOW[name]
    j = CodeJudge(pool, mode=mode)(fenced(code), label)
    assert (j.score, j.extras["passed"], len(j.extras["tests"])) == (0.0, 0, 2), j.extras


def test_forged_call_report_scores_zero(pool):
    label = {"inputs": [[2], [3]], "outputs": [4, 9], "fn_name": "f"}
    for mode in ("fraction", "all"):
        j = CodeJudge(pool, mode=mode)(fenced(EXPLOITS["kills its parent after forging"]), label)
        assert (j.score, j.extras["passed"]) == (0.0, 0), j.extras


def test_the_program_cannot_reach_the_harness(pool):
    """The harness's memory, descriptors and environment are closed to the program; ptrace is refused."""
    probe = ("import ctypes, os\ndef probe():\n    pp, opened = os.getppid(), []\n"
             "    for name in ('mem', 'environ', 'maps', 'fd/0', 'fd/1', 'fd/3'):\n        try:\n"
             "            open('/proc/%d/%s' % (pp, name), 'rb').close()\n            opened.append(name)\n"
             "        except OSError:\n            pass\n"
             "    if ctypes.CDLL(None).ptrace(16, pp, 0, 0) == 0:\n        opened.append('ptrace')\n"
             "    return opened\n")
    j = CodeJudge(pool)(fenced(probe), {"inputs": [[]], "outputs": [[]], "fn_name": "probe"})
    assert j.extras["tests"] == [{"verdict": "pass", "seconds": j.extras["tests"][0]["seconds"]}], j.extras


HONEST = """\
import math
from collections import Counter, namedtuple
P = namedtuple('P', 'x y')
def pair(a):
    return (a, a + 1)
def uniq(xs):
    return set(xs)
def counts(s):
    return Counter(s)
def gen(n):
    for i in range(n):
        yield i * i
def point(x):
    return P(x, -x)
def root(x, *, scale=1.0):
    return math.sqrt(x) * scale
def safe_div(a, b):
    if b == 0:
        raise ValueError('b is 0')
    return a / b
class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
        return self
    def peek(self):
        return self.items[-1]
print('debug output goes nowhere near the report')
"""

HONEST_TESTS = """\
assert pair(1) == (1, 2)
assert uniq([1, 1, 2]) == {1, 2}
assert counts('aab') == {'a': 2, 'b': 1}
assert list(gen(4)) == [0, 1, 4, 9]
assert point(2) == (2, -2)
assert math.isclose(root(2.0, scale=2.0), 2 * 2 ** 0.5)
try:
    safe_div(1, 0)
    raise AssertionError('no error')
except ValueError:
    pass
assert safe_div(1, 4) == 0.25
assert Stack().push(3).push(5).peek() == 5
assert 9 in gen(5)
"""


@pytest.mark.parametrize("mode", ["fraction", "all"])
def test_honest_programs_still_pass(pool, mode):
    j = CodeJudge(pool, mode=mode)(fenced(HONEST), {"tests": HONEST_TESTS})
    assert j.extras["total"] == 9 and j.score == 1.0, j.extras
    he = {"tests": "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n"
                   "    assert candidate([]) == []\n", "entry_point": "sort_list"}
    assert CodeJudge(pool, mode=mode)(fenced("def sort_list(xs):\n    return sorted(xs)"), he).score == 1.0


def test_partly_correct_scores_the_exact_fraction(pool):
    code = "def f(x):\n    return x * x if x < 4 else 0\n"
    label = {"tests": "assert f(2) == 4\nassert f(3) == 9\nassert f(4) == 16\nassert f(5) == 25\nassert f(1) == 1"}
    j = CodeJudge(pool)(fenced(code), label)
    assert ([t["verdict"] for t in j.extras["tests"]], j.score) == (
        ["pass", "pass", "wrong_answer", "wrong_answer", "pass"], 3 / 5)
    assert CodeJudge(pool, mode="all")(fenced(code), label).score == 0.0


def test_a_program_that_dies_mid_tests_fails_the_rest(pool):
    code = "import os\ndef f(x):\n    if x == 3:\n        os._exit(0)\n    return x * x\n"
    j = CodeJudge(pool)(fenced(code), {"tests": "assert f(2) == 4\nassert f(3) == 9\nassert f(4) == 16"})
    assert [t["verdict"] for t in j.extras["tests"]] == ["pass", "runtime_error", "runtime_error"]
    assert "the program exited" in j.extras["tests"][1]["stderr"] and j.score == pytest.approx(1 / 3)


def test_report_lines_need_the_key():
    key = new_key()
    import hmac
    import json

    def line(*fields):
        body = json.dumps(list(fields))
        return hmac.new(key, body.encode(), "sha256").hexdigest() + " " + body + "\n"

    good = line("begin") + line("test", 0, "pass", 0.1, None) + line("end", 1)
    assert read_report(good, key, 1) == [["pass", 0.1, None, None]]
    forged = line("begin") + '0' * 64 + ' ["test", 0, "pass", 0, null]\n' + json.dumps(["test", 0, "pass"]) + "\n"
    assert read_report(forged, key, 1) == []
    assert read_report(good, new_key(), 1) is None                 # another run's key: nothing counts
    with pytest.raises(HarnessError, match="breaks its format"):
        read_report(line("begin") + line("test", 1, "pass", 0, None), key, 2)        # out of order
    with pytest.raises(HarnessError, match="2 verdicts for 1 tests"):
        read_report(line("begin") + line("test", 0, "pass", 0, None) + line("test", 1, "pass", 0, None), key, 1)

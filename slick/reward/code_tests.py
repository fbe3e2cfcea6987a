"""The tests of a ``--rm-type code`` label, and the programs that run them.

A label (a dict, or the same as a JSON string) holds one of:

- **stdin/stdout cases** (APPS, TACO, LiveCodeBench): ``{"inputs": [...], "outputs": [...]}``, one program run
  per case with the input on stdin; it passes when its stdout equals the expected output, compared line by
  line with trailing whitespace and trailing empty lines ignored. An input or output may be a string or a list
  of lines. With ``"fn_name"``, the cases are calls instead: ``inputs[i]`` is the list of arguments,
  ``outputs[i]`` the expected return value (compared after a JSON round trip; APPS's ``[value]`` also matches).
- **assert-style tests** (HumanEval, MBPP): ``{"tests": "assert f(1) == 2\\n..."}`` (or a list of such
  strings). Each top-level ``assert`` statement is one test; other statements (imports, helpers) run in
  order before the tests after them. With ``"entry_point"`` (HumanEval) a ``check(candidate)`` function is
  called once with that function, as one test. The program is the response's code followed by a harness
  that runs each test and reports every verdict on a line marked with a random token, so a program that
  exits early (``os._exit(0)``, ``sys.exit()``) passes nothing.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import secrets
from typing import Any, Optional

from slick.reward.errors import label_error

EXPECTED = ('{"inputs": [...], "outputs": [...]} (optionally with "fn_name"), or {"tests": "assert ..."} '
            '(optionally with "entry_point"), as a dict or a JSON string')


@dataclasses.dataclass
class Case:
    """One stdin/stdout or call case: the program's stdin and what must come back."""
    stdin: str
    expected: Any


@dataclasses.dataclass
class TestSpec:
    kind: str                         # "stdio", "call" or "assert"
    cases: list = dataclasses.field(default_factory=list)        # stdio / call
    chunks: list = dataclasses.field(default_factory=list)       # assert: [(source, is_test)]
    fn_name: Optional[str] = None

    @property
    def count(self) -> int:
        return len(self.cases) if self.kind != "assert" else sum(1 for _, t in self.chunks if t)


def _lines(value: Any, what: str, label: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "\n".join(value)
    raise label_error("code", f"{EXPECTED}; each of {what} a string or a list of lines", label)


def parse_label(label: Any) -> TestSpec:
    """The tests of ``label`` (module doc); :class:`~slick.reward.errors.LabelError` when it has none."""
    raw = label
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except ValueError:
            raise label_error("code", EXPECTED, raw) from None
    if not isinstance(label, dict):
        raise label_error("code", EXPECTED, raw)
    if "tests" in label:
        return _assert_spec(label, raw)
    ins, outs = label.get("inputs"), label.get("outputs")
    if not isinstance(ins, list) or not isinstance(outs, list) or not ins or len(ins) != len(outs):
        raise label_error("code", f"{EXPECTED}; inputs and outputs non-empty lists of the same length", raw)
    fn = label.get("fn_name")
    if fn:
        if not isinstance(fn, str) or not fn.isidentifier():
            raise label_error("code", f"{EXPECTED}; fn_name a Python identifier", raw)
        cases = [Case(json.dumps(a if isinstance(a, list) else [a]), o) for a, o in zip(ins, outs)]
        return TestSpec("call", cases=cases, fn_name=fn)
    cases = [Case(_lines(i, "inputs", raw), _lines(o, "outputs", raw)) for i, o in zip(ins, outs)]
    for c in cases:
        if c.stdin and not c.stdin.endswith("\n"):
            c.stdin += "\n"
    return TestSpec("stdio", cases=cases)


def _assert_spec(label: dict, raw: Any) -> TestSpec:
    tests = label["tests"]
    if isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        tests = "\n".join(tests)
    if not isinstance(tests, str) or not tests.strip():
        raise label_error("code", f"{EXPECTED}; tests a non-empty string or list of strings", raw)
    try:
        tree = ast.parse(tests)
    except SyntaxError as e:
        raise label_error("code", f"{EXPECTED}; tests valid Python (line {e.lineno}: {e.msg})", raw) from None
    chunks = [(ast.get_source_segment(tests, node) or "", isinstance(node, ast.Assert)) for node in tree.body]
    entry = label.get("entry_point")
    if entry:
        if not isinstance(entry, str) or not entry.isidentifier():
            raise label_error("code", f"{EXPECTED}; entry_point a Python identifier", raw)
        chunks.append((f"check({entry})", True))
    if not any(is_test for _, is_test in chunks):      # no top-level assert: the whole block is one test
        chunks = [(tests, True)]
    return TestSpec("assert", chunks=chunks)


def normalise_output(text: str) -> list[str]:
    """Lines with trailing whitespace dropped, and trailing empty lines dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def new_token() -> str:
    return "@@slick-" + secrets.token_hex(16)


HARNESS = '''

def __slick_harness(chunks, token):
    import json as _json, os as _os, sys as _sys, time as _time, traceback as _tb
    report = []
    for source, is_test in chunks:
        t0 = _time.perf_counter()
        try:
            exec(compile(source, "<test>", "exec"), globals())
            verdict, error = "pass", None
        except AssertionError:
            verdict, error = "wrong_answer", _tb.format_exc(limit=-1)
        except MemoryError:
            verdict, error = "memory_limit", "MemoryError"
        except BaseException:
            verdict, error = "runtime_error", _tb.format_exc(limit=-1)
        if is_test:
            report.append([verdict, _time.perf_counter() - t0, error])
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    _os.write(1, ("\\n" + token + _json.dumps(report) + "\\n").encode())


__slick_harness(%s, %r)
'''

CALL = '''

def __slick_call(name, token):
    import json as _json, os as _os, sys as _sys
    args = _json.loads(_sys.stdin.read())
    value = globals()[name](*args)
    try:
        _sys.stdout.flush()
    except BaseException:
        pass
    _os.write(1, ("\\n" + token + _json.dumps(value, default=repr) + "\\n").encode())


__slick_call(%r, %r)
'''


def assert_program(code: str, spec: TestSpec, token: str) -> str:
    return code + HARNESS % (repr(spec.chunks), token)


def call_program(code: str, spec: TestSpec, token: str) -> str:
    return code + CALL % (spec.fn_name, token)


def marked(stdout: str, token: str) -> Optional[str]:
    """The text after the last line starting with ``token``, or ``None`` when the program never reported."""
    at = stdout.rfind("\n" + token)
    if at < 0:
        return None
    return stdout[at + 1 + len(token):].split("\n", 1)[0]

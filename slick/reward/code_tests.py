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
  that runs each test (:mod:`slick.reward.code_harness`): the tests and the report stay out of the program's
  reach, and every test gets exactly one verdict; a program that exits early passes nothing.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import hmac
import json
import secrets
from pathlib import Path
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


HARNESS_FILE = Path(__file__).with_name("code_harness.py")
TEST_VERDICTS = ("pass", "ok", "wrong_answer", "runtime_error", "time_limit", "memory_limit", "output_limit", "killed")


class HarnessError(RuntimeError):
    """The harness (slick's own code in the sandbox) did not start or wrote a report that breaks its format."""


@functools.lru_cache(maxsize=1)
def harness_source() -> str:
    """The program the sandbox runs for call and assert tests (:mod:`slick.reward.code_harness`)."""
    return HARNESS_FILE.read_text(encoding="utf-8")


def harness_input(code: str, spec: TestSpec, key: bytes, args: Optional[list] = None) -> str:
    """The harness's stdin: the program, its tests (``args``: the arguments of one call case) and the report key."""
    data = {"key": key.hex(), "kind": spec.kind, "program": code}
    if spec.kind == "call":
        data.update(fn_name=spec.fn_name, args=args)
    else:
        data.update(chunks=[list(c) for c in spec.chunks])
    return json.dumps(data)


def new_key() -> bytes:
    return secrets.token_bytes(32)


def read_report(stdout: str, key: bytes, count: int) -> Optional[list[list]]:
    """The harness's verdicts ``[verdict, seconds, error, got]``, one per test in order, from its report lines
    (``HMAC-SHA256(key, json) json``; a line without the key's MAC is not the harness's and is dropped).
    ``None`` when no line came from the harness; :class:`HarnessError` for a report that breaks the format
    (out of order, more verdicts than tests, a verdict after the end)."""
    begun, ended, entries = False, False, []
    for line in stdout.split("\n")[:-1]:            # complete lines only: a kill may cut the last one
        mac, _, body = line.partition(" ")
        if not hmac.compare_digest(mac.encode(), hmac.new(key, body.encode(), "sha256").hexdigest().encode()):
            continue
        msg = json.loads(body)
        if msg[0] == "begin":
            begun = True
        elif msg[0] == "test" and not ended and msg[1] == len(entries) and msg[2] in TEST_VERDICTS:
            entries.append((msg[2:] + [None])[:4])
        elif msg[0] == "end" and msg[1] == len(entries):
            ended = True
        else:
            raise HarnessError(f"the code harness's report breaks its format at {body[:200]!r}")
    if len(entries) > count:
        raise HarnessError(f"the code harness reported {len(entries)} verdicts for {count} tests")
    return entries if begun else None

"""``--rm-type code``: run the response's program against the label's tests in the sandbox.

The code is the content of the response's last fenced block (```` ```python ... ``` ````; ``--code-block
first`` takes the first, ``none`` the whole response); blocks tagged ``python``/``py``/``python3`` or untagged
are preferred over blocks in other languages. The tests and how they are run: :mod:`slick.reward.code_tests`.
Every program runs in its own sandbox of the pool (:mod:`slick.reward.sandbox`); the cases of one sample run
concurrently. Reward: the fraction of tests passed (``--code-reward-mode fraction``, the default) or 1.0 only
when all pass (``all``). No code block: 0.0.

Evidence (``sample.evidence``): ``answer`` is the extracted code, ``verdict`` whether every test passed, and
the extras ``tests`` (one entry per test: ``verdict`` pass, wrong_answer, runtime_error, time_limit,
memory_limit, output_limit or killed; ``seconds``; ``stderr`` (last lines) for failures; ``expected`` /
``got`` (cut to 200 characters) for wrong answers), ``passed``, ``total`` and ``mode``.
"""
from __future__ import annotations

import json
import re
from typing import Any, Optional

from slick.config import Config
from slick.reward import code_tests as ct
from slick.reward.evidence import Judgement
from slick.reward.sandbox import OK, RUNTIME_ERROR, Result, SandboxPool, default_pool, pool_from_config

MODES = ("fraction", "all")
BLOCKS = ("last", "first", "none")
PYTHON_TAGS = ("", "python", "py", "python3")
SNIPPET = 200
_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(response: str, block: str = "last") -> Optional[str]:
    """The code of ``response`` (module doc); ``None`` when it has no complete fenced block."""
    if block == "none":
        return response or None
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(response or "")]
    python = [code for tag, code in blocks if tag in PYTHON_TAGS] or [code for _, code in blocks]
    if not python:
        return None
    return python[-1] if block == "last" else python[0]


def _failure(r: Result) -> dict:
    out = {"verdict": r.verdict, "seconds": r.seconds}
    if r.stderr_tail:
        out["stderr"] = r.stderr_tail
    return out


def _wrong(expected: Any, got: Any, seconds: float) -> dict:
    return {"verdict": "wrong_answer", "seconds": seconds, "expected": str(expected)[:SNIPPET],
            "got": str(got)[:SNIPPET]}


class CodeJudge:
    """The code verifier: ``judge(response, label, metadata) -> Judgement`` (module doc)."""

    def __init__(self, pool: Optional[SandboxPool] = None, mode: str = "fraction", block: str = "last"):
        if mode not in MODES:
            raise ValueError(f"--code-reward-mode must be one of {', '.join(MODES)}, got {mode!r}")
        if block not in BLOCKS:
            raise ValueError(f"--code-block must be one of {', '.join(BLOCKS)}, got {block!r}")
        self.pool, self.mode, self.block = pool, mode, block
        self.__name__ = self.__qualname__ = "judge_code"     # how thread pools and logs name it

    def __call__(self, response: str, label: Any, metadata: Optional[dict] = None) -> Judgement:
        spec = ct.parse_label(label)           # a bad label raises LabelError before anything runs
        code = extract_code(response, self.block)
        extras: dict = {"tests": [], "passed": 0, "total": spec.count, "mode": self.mode}
        if code is None:
            extras["reason"] = "no fenced code block in the response"
            return Judgement(0.0, None, False, extras)
        pool = self.pool or default_pool()
        run = {"stdio": self._stdio, "call": self._call, "assert": self._asserts}[spec.kind]
        tests = run(pool, code, spec)
        if len(tests) != spec.count:          # exactly one verdict per test, whatever the sandbox said
            raise ct.HarnessError(f"{len(tests)} verdicts for {spec.count} tests")
        passed = sum(t["verdict"] == "pass" for t in tests)
        extras.update(tests=tests, passed=passed)
        score = passed / spec.count if self.mode == "fraction" else float(passed == spec.count)
        return Judgement(score, code, passed == spec.count, extras)

    def _stdio(self, pool: SandboxPool, code: str, spec: ct.TestSpec) -> list[dict]:
        results = pool.run_many([(code, c.stdin) for c in spec.cases])
        out = []
        for case, r in zip(spec.cases, results):
            if not r.ok:
                out.append(_failure(r))
            elif ct.normalise_output(r.stdout) == ct.normalise_output(case.expected):
                out.append({"verdict": "pass", "seconds": r.seconds})
            else:
                out.append(_wrong(case.expected, r.stdout, r.seconds))
        return out

    def _call(self, pool: SandboxPool, code: str, spec: ct.TestSpec) -> list[dict]:
        keys = [ct.new_key() for _ in spec.cases]
        results = pool.run_many([(ct.harness_source(), ct.harness_input(code, spec, key, json.loads(c.stdin)))
                                 for c, key in zip(spec.cases, keys)])
        out = []
        for case, r, key in zip(spec.cases, results, keys):
            entry = _harness_tests(r, key, 1)[0]
            if entry["verdict"] != "ok":
                out.append(entry)
                continue
            got = entry.pop("got")
            expected = json.loads(json.dumps(case.expected, default=repr))
            ok = got == expected or [got] == expected
            out.append({"verdict": "pass", "seconds": r.seconds} if ok else _wrong(expected, got, r.seconds))
        return out

    def _asserts(self, pool: SandboxPool, code: str, spec: ct.TestSpec) -> list[dict]:
        key = ct.new_key()
        r = pool.run(ct.harness_source(), ct.harness_input(code, spec, key))
        return _harness_tests(r, key, spec.count)


def _harness_tests(r: Result, key: bytes, count: int) -> list[dict]:
    """One entry per test from the harness's report; a test without a verdict (the sandbox was stopped before
    it: time, memory, output) gets the sandbox's."""
    entries = ct.read_report(r.stdout, key, count)
    if entries is None and r.verdict in (OK, RUNTIME_ERROR):
        raise ct.HarnessError(f"the code harness did not start ({r.verdict}, exit code {r.exit_code}): "
                              f"{r.stderr_tail or '(no message)'}")
    out = []
    for verdict, seconds, error, got in entries or []:
        entry = {"verdict": verdict, "seconds": seconds}
        if error:
            entry["stderr"] = "\n".join(str(error).strip().splitlines()[-3:])
        if verdict == "ok":
            entry["got"] = got
        out.append(entry)
    fate = _failure(r) if r.verdict != OK else {"verdict": RUNTIME_ERROR, "seconds": r.seconds,
                                                "stderr": r.stderr_tail or "the harness stopped before this test"}
    return out + [dict(fate) for _ in range(count - len(out))]


_DEFAULT = CodeJudge()


def judge(response: str, label: Any, metadata: Optional[dict] = None) -> Judgement:
    """The code verdict with the default pool and options (fraction, last block)."""
    return _DEFAULT(response, label, metadata)


def score(response: str, label: Any, metadata: Optional[dict] = None) -> float:
    return judge(response, label, metadata).score


def judge_from_config(cfg: Config) -> CodeJudge:
    """The judge of a run: a pool with its ``--sandbox-*`` limits, checked now (so a machine without a working
    bwrap fails at start, naming it), and its ``--code-reward-mode`` / ``--code-block``."""
    pool = pool_from_config(cfg.sandbox)
    pool.check()
    return CodeJudge(pool, cfg.code_reward_mode, cfg.code_block)

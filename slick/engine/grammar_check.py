"""Every new grammar is compiled first in a helper process, so that no grammar can crash or hang the engine.

llguidance compiles grammars in Rust, recursively: a JSON schema whose ``$defs`` chain 1,000 deep, or a Lark
grammar of a few thousand chained rules, overflows a thread's stack, and the process dies with SIGSEGV (nothing
in the log). A :class:`GrammarChecker` therefore hands each grammar it has not seen before to one long-lived
helper (``python -m slick.engine.grammar_check MODEL_DIR VOCAB EOS_IDS``), which builds the same matcher the
engine would (same tokenizer, a stack of :data:`STACK_BYTES`) and computes its first mask:

- the helper answers: the grammar is good (remembered, by hash) or bad (a :class:`GrammarError` with llguidance's
  message);
- the helper dies (a crash of the compiler): the request is refused naming the signal, and the next grammar
  starts a new helper;
- no answer within ``timeout_s`` (``--grammar-timeout-s``): the helper is killed and the request is refused
  naming the limit.

The engine then compiles a grammar that passed on a thread with the same stack (``slick/engine/grammar.py``).
Only one grammar is checked at a time, so hostile grammars queue behind each other rather than beside the
engine's work. The helper exits when the engine closes or its stdin closes (the engine's process died).
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Optional

from slick.engine.limits import LimitError
from slick.models.tokenizer import load_tokenizer     # light: transformers is imported when it loads one

STACK_BYTES = 256 << 20          # the compile threads' stack (virtual: only what a compile touches is used)
START_TIMEOUT_S = 120.0          # the helper loads the tokenizer once
REMEMBER = 1024                  # grammars known to compile (hashes)
_STACK_LOCK = threading.Lock()


class GrammarError(ValueError):
    """A constraint llguidance cannot compile; ``field`` names it (e.g. ``sampling.json_schema``)."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


def big_stack_thread(target, name: str) -> threading.Thread:
    """Start a daemon thread running ``target`` with a stack of :data:`STACK_BYTES`."""
    with _STACK_LOCK:
        old = threading.stack_size(STACK_BYTES)
        try:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
        finally:
            threading.stack_size(old)
    return t


class GrammarChecker:
    """The engine's side of the helper process (module doc)."""

    def __init__(self, model_dir: str, vocab_size: int, eos_ids, timeout_s: float):
        self.cmd = [sys.executable, "-m", "slick.engine.grammar_check", str(model_dir), str(int(vocab_size)),
                    json.dumps([int(t) for t in eos_ids])]
        self.timeout_s = float(timeout_s)
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()
        self._good: collections.OrderedDict = collections.OrderedDict()
        self.crashes = 0
        self.timeouts = 0

    def check(self, grammar: str, field: str) -> None:
        """Return when ``grammar`` compiles; raise GrammarError (bad, or the compiler crashed) or
        LimitError (``timeout_s`` passed)."""
        key = hashlib.sha256(grammar.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            if key in self._good:
                self._good.move_to_end(key)
                return
            error = self._ask(grammar, field)
            if error:
                raise GrammarError(f"{field}: {error}", field)
            self._good[key] = True
            while len(self._good) > REMEMBER:
                self._good.popitem(last=False)

    def _ask(self, grammar: str, field: str) -> str:
        proc = self._start()
        try:
            proc.stdin.write((json.dumps({"grammar": grammar}) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass                      # it died: reading says how
        line = _read_line(proc, self.timeout_s)
        if line is None:
            self._kill()
            self.timeouts += 1
            raise LimitError(f"{field}: the grammar did not compile within {self.timeout_s:g} s; the limit is "
                             f"{self.timeout_s:g} (--grammar-timeout-s)", field, "grammar_timeout_s")
        if not line:
            rc = proc.wait()
            self._proc = None
            self.crashes += 1
            how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
            raise GrammarError(f"{field}: the grammar compiler crashed on this grammar ({how}, in slick's helper "
                               "process; the server is unaffected); refused. Make it smaller or less deeply "
                               "nested (--max-grammar-bytes, --max-grammar-depth)", field)
        return json.loads(line)["error"]

    def _start(self) -> subprocess.Popen:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._proc = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        ready = _read_line(self._proc, START_TIMEOUT_S)
        if ready is None or json.loads(ready or "{}").get("ready") is not True:
            self._kill()
            raise RuntimeError(f"the grammar helper ({' '.join(self.cmd[:4])}) did not start within "
                               f"{START_TIMEOUT_S:g} s")
        return self._proc

    def _kill(self) -> None:
        p, self._proc = self._proc, None
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(timeout=10)

    def close(self) -> None:
        """Stop the helper (it also exits by itself when this process dies: its stdin closes)."""
        with self._lock:
            self._kill()


def _read_line(proc: subprocess.Popen, timeout_s: float) -> Optional[str]:
    """One line from ``proc``'s stdout: the text (without the newline), "" at EOF, None after ``timeout_s``."""
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return ""
        buf += chunk
    return buf.decode().strip()


# ----------------------------------------------------------------------------------------------- the helper
def _compile(llt, grammar: str) -> str:
    import llguidance

    m = llguidance.LLMatcher(llt, grammar, log_level=0)
    if not m.is_error():
        m.compute_bitmask()          # the lexer's first step runs too
    return m.get_error() if m.is_error() else ""


def main(argv: list[str]) -> int:
    """The helper: read ``{"grammar"}`` lines, answer ``{"error": ""}`` (compiles) or ``{"error": message}``."""
    import llguidance.hf

    model_dir, vocab, eos = argv[0], int(argv[1]), json.loads(argv[2])
    llt = llguidance.hf.from_tokenizer(load_tokenizer(model_dir), n_vocab=vocab, eos_token=eos or None)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        grammar = json.loads(line)["grammar"]
        result = {}

        def run():
            try:
                result["error"] = _compile(llt, grammar)
            except Exception as e:  # noqa: BLE001 - llguidance raises on API misuse; report it as the error
                result["error"] = f"{type(e).__name__}: {e}"

        big_stack_thread(run, "slick-grammar-check").join()
        out.write(json.dumps({"error": result.get("error", "no answer")}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Grammar-constrained decoding: a per-request token mask from llguidance, applied in the sampling step.

A request whose :class:`slick.types.SamplingParams` sets ``json_schema`` (a JSON string), ``regex`` or ``ebnf``
(llguidance's Lark syntax, which also reads GBNF; ``%json{...}`` embeds a schema) gets an ``llguidance.LLMatcher``.
Before every sampling step the engine asks each such request's matcher which tokens may come next and sets the
logits of every other token to ``-inf`` (:func:`apply_masks`); after the step it feeds the sampled token back
(:func:`advance`). When the grammar is complete, the only tokens allowed are the stop tokens, so the request
ends with finish reason "stop" and its text parses. (A ``max_new_tokens`` limit can still cut it: "length".)

The logprob reported for a constrained token is that of the distribution actually sampled from: the masked
softmax ``log_softmax(masked_logits / T)``, which is >= the unmasked logprob of the same token. Training on such
tokens treats the grammar as part of the policy: the trainer recomputes the *unmasked* logprob, so the
importance ratio of constrained tokens starts below 1 (see docs/serving.md, "Structured output").

Why llguidance: a 3 MB wheel with no dependencies (xgrammar pulls triton; outlines-core needs an index per
schema built over the whole vocabulary first), masks computed lazily in Rust in tens of microseconds per token,
and JSON schema, regex and Lark grammars behind one matcher. The tokenizer wrapper is built once per engine.

Hostile grammars: llguidance compiles recursively and a deep enough grammar overflows any stack (SIGSEGV), so
a grammar is first checked against the engine's limits (``slick/engine/limits.py``: size, JSON nesting), then
compiled once in a helper process (``slick/engine/grammar_check.py``: a crash or a timeout there refuses the
request), and only then compiled here, on a thread with the helper's stack size.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import queue
import threading
from typing import Any, Optional, Sequence

import torch

from slick.engine.grammar_check import GrammarError, big_stack_thread   # a grammar is checked in a helper first
from slick.engine.limits import LimitError

log = logging.getLogger("slick.engine")

FIELDS = ("json_schema", "regex", "ebnf")
# compact JSON (no free whitespace between tokens: a model could otherwise emit blanks until the length limit)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHED_MATCHERS = 16     # compiled grammars kept (a request with n choices compiles its grammar once)


def constraint_of(sp: Any, where: str = "sampling") -> Optional[tuple[str, str]]:
    """``(field, text)`` of the one grammar field ``sp`` sets, or None; two set at once is a GrammarError."""
    set_ = [(f, getattr(sp, f, None)) for f in FIELDS if getattr(sp, f, None) is not None]
    if not set_:
        return None
    if len(set_) > 1:
        raise GrammarError(f"{where}: set one of {', '.join(FIELDS)}, not {' and '.join(f for f, _ in set_)}",
                           f"{where}.{set_[1][0]}")
    name, text = set_[0]
    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{where}.{name} must be a non-empty string, got {str(text)[:80]!r}", f"{where}.{name}")
    return name, text


def llg_grammar(name: str, text: str, where: str = "sampling") -> str:
    """llguidance's grammar text for one constraint field (no tokenizer needed); GrammarError when it is bad."""
    import llguidance

    try:
        if name == "json_schema":
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as e:
                raise GrammarError(f"{where}.json_schema is not JSON: {e}", f"{where}.json_schema") from None
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        if name == "regex":
            return llguidance.LLMatcher.grammar_from_regex(text)
        return llguidance.grammar_from("ebnf", text)
    except GrammarError:
        raise
    except Exception as e:  # noqa: BLE001 - llguidance raises ValueError/RuntimeError on bad input
        raise GrammarError(f"{where}.{name}: {e}", f"{where}.{name}") from None


def compact_schema(schema: dict) -> dict:
    """``schema`` with llguidance's compact-JSON options in it (``x-guidance``; the schema's own options win), so
    an engine that compiles it elsewhere (SGLang's llguidance backend) holds the same JSON as slick's engine."""
    return {**schema, "x-guidance": {**JSON_OPTIONS, **(schema.get("x-guidance") or {})}}


def json_lark(schema: dict) -> str:
    """A Lark rule body embedding ``schema`` with compact JSON (for grammars built around JSON values)."""
    return "%json " + json.dumps(compact_schema(schema), ensure_ascii=False)


class Grammars:
    """Compiles constraints into matchers for one tokenizer (its llguidance wrapper is built on first use).

    ``checker`` (a :class:`slick.engine.grammar_check.GrammarChecker`) compiles every new grammar in a helper
    process first, so that a grammar that would crash the compiler or hang it is refused instead; the engine's own
    compile then runs on one thread with a large stack, one grammar at a time, and the last
    ``CACHED_MATCHERS`` compiled grammars are copied instead of compiled again. ``timeout_s`` bounds the wait
    for the engine's own compile."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: Sequence[int], checker=None, timeout_s: float = 10.0):
        self.tokenizer, self.vocab_size, self.eos_ids = tokenizer, int(vocab_size), list(eos_ids)
        self.checker, self.timeout_s = checker, float(timeout_s)
        self._llt = None
        self._lock = threading.Lock()
        self._jobs: "queue.Queue" = queue.Queue()
        self._worker = None
        self._cache: collections.OrderedDict = collections.OrderedDict()

    def _tokenizer(self):
        with self._lock:
            if self._llt is None:
                import llguidance.hf

                self._llt = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size,
                                                         eos_token=self.eos_ids or None)
            return self._llt

    def matcher(self, sp: Any, where: str = "sampling"):
        """An ``LLMatcher`` for ``sp``'s constraint, or None when it sets none. Raises GrammarError naming the
        field when the grammar does not compile (or crashed the helper), LimitError when it took too long.
        Blocking (the first call builds the tokenizer wrapper, ~0.3 s, and starts the helper): call it off the
        event loop."""
        c = constraint_of(sp, where)
        if c is None:
            return None
        field = f"{where}.{c[0]}"
        grammar = llg_grammar(*c, where=where)
        with self._lock:
            m = self._cache.get(grammar)
            if m is not None:
                self._cache.move_to_end(grammar)
                return m.deep_copy()
        if self.checker is not None:
            self.checker.check(grammar, field)
        m = self._compile(grammar, field)
        if m.is_error():
            raise GrammarError(f"{field}: {m.get_error()}", field)
        with self._lock:
            self._cache[grammar] = m.deep_copy()
            while len(self._cache) > CACHED_MATCHERS:
                self._cache.popitem(last=False)
        return m

    def _compile(self, grammar: str, field: str):
        """``LLMatcher(grammar)`` built on the compile thread (large stack, one at a time)."""
        llt = self._tokenizer()
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._worker is None:
                self._worker = big_stack_thread(self._serve, "slick-grammar")
        self._jobs.put((llt, grammar, fut))
        try:
            return fut.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            raise LimitError(f"{field}: the grammar did not compile within {self.timeout_s:g} s; the limit is "
                             f"{self.timeout_s:g} (--grammar-timeout-s)", field, "grammar_timeout_s") from None

    def _serve(self) -> None:
        import llguidance

        while True:
            llt, grammar, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(llguidance.LLMatcher(llt, grammar, log_level=0))
            except Exception as e:  # noqa: BLE001 - handed to the waiting request
                fut.set_exception(e)

    def close(self) -> None:
        """Stop the helper process (the compile thread is a daemon and idles)."""
        if self.checker is not None:
            self.checker.close()


_BITS = None


def _bits(device) -> torch.Tensor:
    global _BITS
    if _BITS is None or _BITS.device != device:
        _BITS = (1 << torch.arange(32, dtype=torch.int64, device=device)).view(1, 32)
    return _BITS


def allowed(matcher, vocab: int, device=None) -> torch.Tensor:
    """Boolean [vocab]: the tokens ``matcher`` allows next (from its bitmask, one bit per token)."""
    words = torch.frombuffer(bytearray(matcher.compute_bitmask()), dtype=torch.int32).to(torch.int64)
    words = words.to(device) if device is not None else words
    bits = (words.view(-1, 1) & _bits(words.device)) != 0
    out = bits.view(-1)[:vocab]
    if out.numel() < vocab:
        out = torch.cat([out, torch.zeros(vocab - out.numel(), dtype=torch.bool, device=out.device)])
    return out


def apply_masks(logits: torch.Tensor, matchers: Sequence[Optional[Any]], eos_ids: Sequence[int]) -> torch.Tensor:
    """``logits`` with ``-inf`` wherever row ``i``'s matcher forbids a token (a new tensor: the model's logits
    may be inference tensors); rows without a matcher are unchanged. A matcher in an error state (it cannot
    happen through :func:`advance`, which only feeds tokens its mask allowed) allows only the stop tokens."""
    B, V = logits.shape
    forbid = torch.zeros(B, V, dtype=torch.bool, device=logits.device)
    for i, m in enumerate(matchers):
        if m is None:
            continue
        if m.is_error() or m.is_stopped():
            keep = torch.zeros(V, dtype=torch.bool, device=logits.device)
            keep[[t for t in eos_ids if t < V]] = True
        else:
            keep = allowed(m, V, logits.device)
        forbid[i] = ~keep
    return logits.masked_fill(forbid, float("-inf"))


def advance(matchers: Sequence[Optional[Any]], tokens: Sequence[int]) -> None:
    """Feed each row's sampled token to its matcher."""
    for m, t in zip(matchers, tokens):
        if m is not None and not m.is_stopped() and not m.consume_token(int(t)):
            log.warning("grammar matcher refused sampled token %d: %s", t, m.get_error())


def finished(matcher) -> bool:
    """True when the grammar is complete and nothing may follow (the request should stop)."""
    return matcher is not None and matcher.is_stopped()

"""What one request may ask of an engine: limits on stop strings, grammars and choices, checked before any work.

A request is hostile input (docs/security.md, "Hostile requests"). Each limit is cheap to check, is checked for
every choice of a request before any starts, and is refused with a :class:`LimitError` (a ValueError, so
``slick serve`` answers 400) that names the field, the limit and the ``slick serve`` flag that sets it:

- ``max_stop``: stop strings per request (every token is checked against each of them);
- ``max_stop_chars``: characters of one stop string (the decoded tail every token checks grows with it);
- ``max_n``: choices of one OpenAI request (``n``);
- ``max_grammar_bytes``: UTF-8 bytes of a ``json_schema`` / ``regex`` / ``ebnf`` constraint;
- ``max_grammar_depth``: nesting of a ``json_schema`` document (objects and arrays), measured without recursion;
- ``grammar_timeout_s``: seconds a grammar may take to compile (enforced by ``slick/engine/grammar_check.py``,
  which compiles every new grammar in a helper process first, so a compiler crash refuses the request instead of
  ending the server).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slick.chat.safejson import depth

DEFAULTS = {"max_stop": 64, "max_stop_chars": 512, "max_n": 128, "max_grammar_bytes": 128 * 1024,
            "max_grammar_depth": 64, "grammar_timeout_s": 10.0}
FLAGS = {"max_stop": "--max-stop-strings", "max_stop_chars": "--max-stop-chars", "max_n": "--max-n",
         "max_grammar_bytes": "--max-grammar-bytes", "max_grammar_depth": "--max-grammar-depth",
         "grammar_timeout_s": "--grammar-timeout-s"}


class LimitError(ValueError):
    """A request over one of the engine's limits; ``field`` names the request field, ``limit`` the limit."""

    def __init__(self, message: str, field: str = "", limit: str = ""):
        super().__init__(message)
        self.field, self.limit = field, limit


@dataclass(frozen=True)
class RequestLimits:
    """The limits of one engine (module doc); the defaults are :data:`DEFAULTS`."""

    max_stop: int = DEFAULTS["max_stop"]
    max_stop_chars: int = DEFAULTS["max_stop_chars"]
    max_n: int = DEFAULTS["max_n"]
    max_grammar_bytes: int = DEFAULTS["max_grammar_bytes"]
    max_grammar_depth: int = DEFAULTS["max_grammar_depth"]
    grammar_timeout_s: float = DEFAULTS["grammar_timeout_s"]

    def __post_init__(self):
        for name in DEFAULTS:
            v = getattr(self, name)
            if name == "grammar_timeout_s":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
                    raise ValueError(f"{FLAGS[name]} {v!r}: must be a finite number of seconds > 0")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{FLAGS[name]} {v!r}: must be an integer >= 1")

    def refuse(self, name: str, field: str, what: str) -> LimitError:
        return LimitError(f"{field}: {what}; the limit is {getattr(self, name):g} ({FLAGS[name]})", field, name)

    def check_sampling(self, sp: Any, where: str = "sampling") -> None:
        """Raise :class:`LimitError` when ``sp`` (a SamplingParams) is over a stop-string or grammar limit; the
        field is ``where.stop`` etc. (just ``stop`` when ``where`` is empty)."""
        at = (lambda f: f"{where}.{f}") if where else (lambda f: f)
        stop = sp.stop or ()
        if len(stop) > self.max_stop:
            raise self.refuse("max_stop", at("stop"), f"{len(stop)} stop strings")
        longest = max((len(s) for s in stop if isinstance(s, str)), default=0)
        if longest > self.max_stop_chars:
            raise self.refuse("max_stop_chars", at("stop"), f"a stop string of {longest} characters")
        for name in ("json_schema", "regex", "ebnf"):
            text = getattr(sp, name, None)
            if isinstance(text, str):
                self.check_grammar(name, text, at(name))

    def check_grammar(self, name: str, text: str, field: str) -> None:
        """Size (and, for a JSON schema, nesting depth) of one grammar field."""
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_grammar_bytes:
            raise self.refuse("max_grammar_bytes", field, f"{size} bytes")
        if name == "json_schema":
            d = depth(text)
            if d > self.max_grammar_depth:
                raise self.refuse("max_grammar_depth", field, f"nested {d} levels deep")

    def check_n(self, n: int, field: str = "n") -> None:
        if n > self.max_n:
            raise self.refuse("max_n", field, f"{n} choices")


def limits_of(engine: Any) -> RequestLimits:
    """``engine.limits`` when it has them (slick's LocalEngine), else the defaults."""
    lim = getattr(engine, "limits", None)
    return lim if isinstance(lim, RequestLimits) else RequestLimits()



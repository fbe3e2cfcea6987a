"""The ``KIND:ID[?size=N&seed=S]`` of ``--environment`` and of an environment's ``--prompt-data``
(slick/rollout/envs/__init__.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import parse_qsl

KINDS = ("verifiers", "textarena")
INSTALL = "pip install 'slick[envs]'"


class EnvSpecError(ValueError):
    pass


@dataclass(frozen=True)
class EnvSpec:
    """``KIND:ID[?size=N&seed=S]``: ``size`` prompts (default 64), from ``seed`` (default 0; textarena: the first
    game seed; verifiers: the first task index)."""

    kind: str
    id: str
    size: int = 64
    seed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"


def is_spec(text: Optional[str]) -> bool:
    return isinstance(text, str) and text.split(":", 1)[0] in KINDS and ":" in text


def parse(text: str) -> EnvSpec:
    """The spec of ``--environment`` or of a ``--prompt-data`` naming an environment; ``EnvSpecError`` naming
    what is wrong."""
    if not is_spec(text):
        raise EnvSpecError(f"{text!r}: an environment is KIND:ID with KIND one of {', '.join(KINDS)}")
    kind, rest = text.split(":", 1)
    ident, _, query = rest.partition("?")
    if not ident:
        raise EnvSpecError(f"{text!r}: no id after '{kind}:'")
    values = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    out = {}
    for key in ("size", "seed"):
        if key in values:
            try:
                out[key] = int(values.pop(key))
            except ValueError:
                raise EnvSpecError(f"{text!r}: {key} must be an integer") from None
    if out.get("size", 1) < 1 or out.get("seed", 0) < 0:
        raise EnvSpecError(f"{text!r}: size must be >= 1 and seed >= 0")
    if values:
        raise EnvSpecError(f"{text!r}: unknown option(s) {sorted(values)} (size, seed)")
    return EnvSpec(kind, ident, extra={}, **out)

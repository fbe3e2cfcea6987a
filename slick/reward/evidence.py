"""Verifier evidence: what a reward function saw and decided, kept on every scored sample.

``sample.evidence`` (a plain JSON-able dict, set by :class:`~slick.reward.hub.RewardHub`) always has
these keys (:data:`KEYS`):

- ``reward_type``: ``"math"``, ``"gsm8k"``, ``"exact"``, ``"f1"``, ``"countdown"``, ``"boxed_<type>"``,
  ``"remote_rm"``, ``"custom"`` (``--custom-rm-path``) or ``"agent"`` (a reward the agent function returned);
- ``answer``: the answer the verifier extracted from the response (a string), or ``None``;
- ``verdict``: ``True`` / ``False`` for the rule types (``f1``: an exact match after normalisation), for
  remote and custom rewards the ``"verdict"`` entry of a dict reward when it is a bool, else ``None``;
  ``None`` too when the reward failed;
- ``error``: the failure message (the same text as ``metadata["reward_error"]``), or ``None``;
- ``seconds``: wall time of the verifier call (the whole group call with ``--group-rm``).

and reward-type extras: ``gold`` (the label as the verifier read it), ``box`` (``boxed_<type>``),
``value`` / ``numbers_used`` / ``target`` / ``numbers`` / ``reason`` (countdown), ``f1`` / ``best_label`` (f1),
``reply`` (remote_rm: the server's reply; custom and agent: the value the function returned, a dict as is),
``function`` (custom: the ``--custom-rm-path``). A custom function may add its own entries by writing into
``sample.evidence`` before it returns; they are kept (the standard keys above win).

The rule scorers compute a :class:`Judgement` (score plus the extracted answer and extras) with one function
per type (``judge``); their ``score`` functions return ``judge(...).score``, so scoring and evidence never
disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Optional

KEYS = ("reward_type", "answer", "verdict", "error", "seconds")


@dataclass
class Judgement:
    """One rule verifier's decision: the reward, the extracted answer (``None``: nothing extracted), the
    verdict (``None``: a graded score with no yes/no answer) and reward-type extras (JSON-able)."""
    score: float
    answer: Optional[str] = None
    verdict: Optional[bool] = None
    extras: dict = field(default_factory=dict)

    @classmethod
    def binary(cls, ok: bool, answer: Optional[str], **extras: Any) -> "Judgement":
        return cls(1.0 if ok else 0.0, answer, bool(ok), extras)


def fraction_text(x: Optional[Fraction]) -> Optional[str]:
    """``Fraction(42)`` -> ``"42"``, ``Fraction(5, 2)`` -> ``"5/2"``; ``None`` stays ``None``."""
    if x is None:
        return None
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"


def jsonable(value: Any) -> Any:
    """``value`` made JSON-able: numbers, strings, bools and None as they are, containers recursively,
    NumPy/torch scalars as floats, anything else as its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "__float__"):
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def make_evidence(reward_type: str, *, answer: Optional[str] = None, verdict: Optional[bool] = None,
                  error: Optional[str] = None, seconds: float = 0.0, extras: Optional[dict] = None,
                  base: Optional[dict] = None) -> dict:
    """The evidence dict: ``base`` (entries a custom function wrote), then ``extras``, then the standard keys."""
    out = dict(base or {})
    out.update(jsonable(extras or {}))
    out.update({"reward_type": reward_type, "answer": answer, "verdict": verdict, "error": error,
                "seconds": float(seconds)})
    return out


def reply_evidence(reward_type: str, reply: Any, seconds: float, base: Optional[dict] = None,
                   **extras: Any) -> dict:
    """Evidence of a remote, custom or agent reward: ``reply`` is what came back; a dict's ``"answer"`` and
    boolean ``"verdict"`` entries fill those keys."""
    answer = verdict = None
    if isinstance(reply, dict):
        if reply.get("answer") is not None:
            answer = str(reply["answer"])
        if isinstance(reply.get("verdict"), bool):
            verdict = reply["verdict"]
    return make_evidence(reward_type, answer=answer, verdict=verdict, seconds=seconds,
                         extras={**extras, "reply": reply}, base=base)

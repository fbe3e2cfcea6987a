"""Answers of an HTTP engine or teacher checked before the run uses them.

An engine server is a separate program (``slick serve``, SGLang, vLLM, or whatever answers at ``--rollout-urls`` /
``--opd-teacher-url``); a broken or hostile one can answer bytes that are not UTF-8, JSON of the wrong shape, or
numbers no model computes. Training on a logprob of +5.0, or on NaN, corrupts the policy silently (a NaN loss is
then blamed on the rewards), so every answer is checked here and refused with :class:`AnswerError` (a ValueError)
saying what was wrong; the client names the server (URL and route) in the EngineError it raises:

* the body decodes as UTF-8 (:func:`decode_body`);
* a generation has one logprob per token, token ids are non-negative integers, and every logprob is a finite
  number no greater than :data:`LOGPROB_SLACK` (a probability cannot exceed 1; the slack allows the rounding of an
  engine computing in bf16) (:func:`check_generation`);
* prompt logprobs (a teacher's scores, the mismatch probe) follow the same rule (:func:`check_logprob_rows`).
"""
from __future__ import annotations

import math
from typing import Sequence

LOGPROB_SLACK = 0.1


class AnswerError(ValueError):
    """An engine's answer that the run must not use (what was wrong, without the server: the caller adds it)."""


def decode_body(raw: bytes) -> str:
    """``raw`` as UTF-8 text; AnswerError naming the first bad byte's offset otherwise."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AnswerError(f"the answer is not UTF-8 text (byte {e.start} of {len(raw)}: "
                          f"{raw[e.start:e.start + 8]!r})") from None


def check_logprob(lp, what: str) -> float:
    """``lp`` as a float when it is a finite number <= LOGPROB_SLACK; AnswerError naming ``what`` otherwise."""
    if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp) or lp > LOGPROB_SLACK:
        raise AnswerError(f"{what} is {lp!r}: a logprob must be a finite number <= 0")
    return float(lp)


def check_generation(gen) -> None:
    """A :class:`slick.types.Generation` as an engine returned it (module doc)."""
    ids, lps = gen.token_ids, gen.logprobs
    if len(lps) != len(ids):
        raise AnswerError(f"{len(lps)} logprobs for {len(ids)} tokens")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise AnswerError(f"output token {i} is {t!r}, not a token id")
    for i, lp in enumerate(lps):
        check_logprob(lp, f"the logprob of output token {i}")


def check_logprob_rows(rows: Sequence[dict], what: str = "prompt logprobs") -> None:
    """``[{token: logprob}]`` rows (prompt logprobs): every value a logprob (module doc)."""
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise AnswerError(f"{what} position {i} is {type(row).__name__}, not a token -> logprob map")
        for t, lp in row.items():
            check_logprob(lp, f"{what} position {i}, token {t}")

"""Reward failure kinds the hub counts on their own (both are ``ValueError``s, so callers that
catch ``ValueError`` keep working).

- :class:`LabelError`: a scorer cannot use the sample's label (wrong type, nothing to parse):
  a data problem, counted in ``reward/bad_labels``.
- :class:`NonFiniteRewardError`: the scalar reward training would use is NaN or infinite,
  counted in ``reward/nonfinite``.
"""
from __future__ import annotations


class LabelError(ValueError):
    """The label cannot be scored by this reward type; the message names the type and the label."""


class NonFiniteRewardError(ValueError):
    """A reward (or the ``--reward-key`` field of a dict reward) is NaN or infinite."""


def label_error(rm_type: str, expected: str, label: object) -> LabelError:
    """A :class:`LabelError` saying what ``rm_type`` expects and what type and value it got."""
    return LabelError(f"{rm_type} reward: label must be {expected}, "
                      f"got {type(label).__name__}: {str(label)[:80]!r}")

"""Per-sample reward shaping by response length: DAPO's soft overlong penalty (``--overlong-buffer-len``).

With ``L_max = --rollout-max-response-len``, a buffer of ``L_buf`` tokens and factor ``f``, a response of ``n``
tokens gets ``min(-(n - (L_max - L_buf)) / L_buf * f, 0)`` added to its reward: nothing up to ``L_max - L_buf``
tokens, then linearly down to ``-f`` at ``L_max`` (the DAPO paper; verl's DAPO reward manager).
"""
from __future__ import annotations


def overlong_penalty(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    """The penalty (<= 0) of a response of ``length`` tokens (module doc)."""
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"overlong buffer length must be in 1..{max_len} (the maximum response length), "
                         f"got {buffer_len}")
    exceed = length - (max_len - buffer_len)
    return min(-exceed / buffer_len * factor, 0.0)

"""Routed experts on SGLang's ``/generate`` wire (routing replay over HTTP; docs/moe.md, docs/serving.md).

A request asks with ``return_routed_experts: true`` and may give ``routed_experts_start_len`` (default 0): the
absolute position the answer starts from, between 0 and the prompt's length. The answer's
``meta_info["routed_experts"]`` is the base64 of an int32 array ``[positions, MoE layers, k]`` (row-major, no
header) for positions ``start .. prompt + output - 2``: every token that was an input to the model from ``start``
on (the last sampled token never is). Its shape is not sent: a client knows its model's MoE layers and ``k``.

slick keeps a record as ``{"shape": [tokens, layers, k], "uint8_b64": ...}`` (``slick.algo.routing``); the
functions here turn one into the other and check the request fields. Pure functions, no I/O.
"""
from __future__ import annotations

import base64
from typing import Any, Optional

import numpy as np
import torch

from slick.algo.routing import decode_routing, encode_routing
from slick.serve.http_protocol import RequestError

FIELD = "return_routed_experts"
START_FIELD = "routed_experts_start_len"


def routed_fields(body: dict, prompt_lens: list[int]) -> tuple[bool, int]:
    """``(return_routed_experts, routed_experts_start_len)`` of a ``/generate`` body, checked: a boolean, and an
    integer in ``[0, shortest prompt]``; ``RequestError`` naming the field otherwise."""
    want = body.get(FIELD)
    want = False if want is None else want
    if not isinstance(want, bool):
        raise RequestError(f"{FIELD} must be a boolean, got {want!r}")
    start = body.get(START_FIELD)
    start = 0 if start is None else start
    shortest = min(prompt_lens) if prompt_lens else 0
    if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= shortest:
        raise RequestError(f"{START_FIELD} must be an integer in [0, {shortest}] (an absolute position, at "
                                f"most the prompt's {shortest} tokens), got {start!r}")
    return want, start


def record_to_wire(record: dict, start: int) -> str:
    """The ``meta_info["routed_experts"]`` string of a slick record from position ``start`` on."""
    ids = decode_routing(record)
    if not 0 <= start <= ids.shape[0]:
        raise ValueError(f"{START_FIELD}={start} is beyond the record's {ids.shape[0]} positions")
    arr = ids[start:].to(torch.int32).contiguous().numpy()
    return base64.b64encode(arr.astype("<i4", copy=False).tobytes()).decode("ascii")


def record_from_wire(text: Any, layers: int, k: int) -> dict:
    """A slick record ``{"shape", "uint8_b64"}`` from a ``meta_info["routed_experts"]`` string of a model with
    ``layers`` MoE layers of ``k`` experts per token; ``ValueError`` naming what does not fit."""
    if not isinstance(text, str):
        raise ValueError(f"meta_info.routed_experts must be a base64 string, got {type(text).__name__}")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError as e:
        raise ValueError(f"meta_info.routed_experts is not base64: {e}") from None
    row = 4 * layers * k
    if layers < 1 or k < 1 or len(raw) % row:
        raise ValueError(f"meta_info.routed_experts has {len(raw)} bytes, not a whole number of int32 rows of "
                         f"{layers} MoE layers x {k} experts")
    arr = np.frombuffer(raw, dtype="<i4").reshape(-1, layers, k)
    if arr.size and (arr.min() < 0 or arr.max() > 255):
        raise ValueError(f"meta_info.routed_experts holds expert ids outside [0, 255] "
                         f"({int(arr.min())}..{int(arr.max())})")
    return encode_routing(torch.from_numpy(arr.astype(np.uint8)))


def wire_meta(record: Optional[dict], start: int) -> dict:
    """The ``meta_info`` entries of one generation asked with ``return_routed_experts`` (none when it has no
    record: a request with ``max_new_tokens`` 0, or one aborted before its prompt ran)."""
    return {} if record is None else {"routed_experts": record_to_wire(record, start)}

"""JSON in and out of slick's HTTP servers: strict request bodies, responses that are always valid JSON.

Requests (:func:`read_json`, :func:`decode_json`): the body must be UTF-8 JSON (RFC 8259). Refused with
:class:`BodyError` (400, naming the field where there is one): malformed JSON, ``NaN`` / ``Infinity``
literals and numbers too large for a float (``1e400``), integers of more digits than Python converts, nesting
too deep to parse, and any string (value or key) holding a lone UTF-16 surrogate (``"\\ud800"``: not Unicode,
no tokenizer can take it). A body over the app's ``client_max_size`` is refused with 413. A body over
:data:`THREAD_BYTES` is decoded and checked in a worker thread, so the event loop (``/health``) keeps answering;
one thread for all of them, as ``json.loads`` holds the GIL for its whole call: large bodies arriving together
are decoded one after the other, and the event loop runs between them.

Responses (:func:`dumps`, :func:`json_response`): never contain ``NaN`` or ``Infinity`` (not JSON). A non-finite
float is written as: ``-Infinity`` -> ``-9999.0`` (OpenAI's value for a logprob whose probability rounds to zero),
``+Infinity`` -> ``9999.0``, ``NaN`` -> ``null``.
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
import math
import re
from typing import Any, Optional

from aiohttp import web

THREAD_BYTES = 256 * 1024          # bodies larger than this are decoded off the event loop
NEG_INF_AS = -9999.0
POS_INF_AS = 9999.0
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_DECODER = ThreadPoolExecutor(1, thread_name_prefix="slick-json")


class BodyError(ValueError):
    """A request body slick refuses; ``status`` is the HTTP status, ``param`` the field (or None)."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None):
        super().__init__(message)
        self.status, self.param = status, param


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number (numbers must be finite)")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"the number {text[:40]} is too large to be represented (float overflow)")
    return v


def decode_json(raw: bytes) -> Any:
    """``raw`` parsed as strict JSON (module doc); raises :class:`BodyError`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"request body is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise BodyError(f"malformed JSON body: {e}") from None
    except ValueError as e:          # NaN/Infinity, float overflow, an integer of too many digits
        raise BodyError(f"unrepresentable number in JSON body: {e}") from None
    except RecursionError:
        raise BodyError("JSON body is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(text):          # only a \uD8xx-\uDFxx escape can produce a lone surrogate
        where, s = lone_surrogate(obj)
        if where is not None:
            cp = _SURROGATE.search(s).group()
            raise BodyError(f"{where} contains a lone UTF-16 surrogate (U+{ord(cp):04X}); strings must be valid "
                            f"Unicode", param=where)
    return obj


def lone_surrogate(obj: Any) -> tuple[Optional[str], str]:
    """(path like ``messages[0].content``, the string) of the first string or key holding a lone surrogate."""
    stack = [(obj, "body")]
    while stack:
        o, path = stack.pop()
        if isinstance(o, str):
            if _SURROGATE.search(o):
                return path, o
        elif isinstance(o, dict):
            for k, v in o.items():
                if _SURROGATE.search(k):
                    return f"{path} key {k.encode('utf-8', 'backslashreplace').decode()!r}", k
                stack.append((v, k if path == "body" else f"{path}.{k}"))
        elif isinstance(o, list):
            stack.extend((v, f"{'' if path == 'body' else path}[{i}]") for i, v in enumerate(o))
    return None, ""


async def read_json(request: web.Request, default: Any = None) -> Any:
    """The request's body, decoded by :func:`decode_json` (in a thread when large); an empty body is
    ``default`` when given, else refused."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise BodyError(f"request body too large: {e.text} (--max-request-bytes)", 413) from None
    if not raw.strip():
        if default is not None:
            return default
        raise BodyError("request body is empty; expected JSON")
    if len(raw) > THREAD_BYTES:
        return await asyncio.get_running_loop().run_in_executor(_DECODER, decode_json, raw)
    return decode_json(raw)


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        if math.isfinite(o):
            return o
        return None if math.isnan(o) else (POS_INF_AS if o > 0 else NEG_INF_AS)
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def dumps(obj: Any) -> str:
    """``json.dumps`` that never writes NaN or Infinity (module doc)."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), allow_nan=False)


def json_response(obj: Any, status: int = 200, **kw) -> web.Response:
    """``web.json_response`` through :func:`dumps`."""
    return web.json_response(obj, status=status, dumps=dumps, **kw)

"""SGLang native-API wire format: parse and check ``/generate`` requests, build responses.

Pure functions shared by the server (``slick serve``) and the client (``HttpEngine``). Nothing here
does I/O. Field names and shapes follow SGLang's ``/generate``:

request  ``{"input_ids": [...] | [[...], ...], "text": str | [str], "sampling_params": {...} | [{...}],
           "return_logprob": bool, "logprob_start_len": int, "top_logprobs_num": int, "rid": str | [str],
           "stream": bool}``  (unknown top-level keys are ignored; every ``sampling_params`` key is honoured or
           refused, see ``parse_sampling``)
response ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type", ...}, "prompt_tokens",
           "completion_tokens", "output_token_logprobs": [[logprob, token_id, null], ...], "weight_version",
           "output_token_weight_versions": [int, ...]}}``  (the last one is a slick extension: the weight version
           that sampled each output token; SGLang servers do not send it). With ``logprob_start_len`` >= 0 the
           prompt's ``input_token_logprobs`` (and with ``top_logprobs_num`` ``input_top_logprobs`` and
           ``output_top_logprobs``), as SGLang sends them
"""
from __future__ import annotations

import dataclasses
import math
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from slick.engine.sampling import MAX_TOP_LOGPROBS, validate_sampling   # the engine's own checks
from slick.types import Generation, SamplingParams


class RequestError(ValueError):
    """A client mistake; the server answers it with HTTP ``status`` and ``{"error": message}``."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class GenerateItem:
    """One prompt of a (possibly batched) ``/generate`` request, already checked."""

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams


@dataclass
class GenerateRequest:
    items: list[GenerateItem]
    batched: bool
    return_logprob: bool
    stream: bool
    logprob_start_len: int = -1     # >= 0 with return_logprob: input_token_logprobs from this position on
    top_logprobs_num: int = 0       # with logprob_start_len >= 0: input_top_logprobs of this many tokens


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_ids(ids: Any, where: str, vocab_size: int) -> list[int]:
    if not isinstance(ids, list):
        raise RequestError(f"{where} must be a list of token ids, got {type(ids).__name__}")
    if not ids:
        raise RequestError(f"{where} is empty")
    if set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab_size:
        return ids      # the common case, at C speed; the loop below only names the first bad id
    for i, t in enumerate(ids):
        if not _is_int(t):
            raise RequestError(f"{where}[{i}] must be an integer token id, got {t!r}")
        if t < 0 or t >= vocab_size:
            raise RequestError(f"{where}[{i}] = {t} is outside the vocabulary [0, {vocab_size})")
    return ids


_NUMBER_FIELDS = {"temperature": float, "top_p": float, "top_k": int, "max_new_tokens": int,
                  "sampling_seed": int, "seed": int}
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens")
# SGLang sampling params slick honours (``seed`` is slick's alias of ``sampling_seed``)
HONOURED_SAMPLING = ("max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "sampling_seed",
                     "seed", "ignore_eos", "skip_special_tokens", "no_stop_trim",
                     "json_schema", "regex", "ebnf")     # grammars: slick/engine/grammar.py
# accepted with any value, no effect on the tokens: spacing is the fast tokenizer's (as in SGLang with a fast
# tokenizer), the stream carries one final chunk, custom_params only feed a custom logit processor
NO_EFFECT_SAMPLING = ("spaces_between_special_tokens", "stream_interval", "custom_params")
# accepted only at SGLang's default (or null): any other value is refused, never silently dropped
DEFAULT_ONLY_SAMPLING = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                         "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1,
                         "structural_tag": None, "stop_regex": None,
                         "logit_bias": None}


def parse_sampling(d: Any, where: str = "sampling_params") -> SamplingParams:
    """Check an SGLang ``sampling_params`` dict; raise ``RequestError`` naming any field slick cannot honour.

    ``null`` means the default (as in SGLang). Fields of ``DEFAULT_ONLY_SAMPLING`` set to anything but their
    default, and names SGLang does not know either, are refused rather than silently dropped.
    """
    if d is None:
        d = {}
    if not isinstance(d, dict):
        raise RequestError(f"{where} must be an object, got {type(d).__name__}")
    d = {k: v for k, v in d.items() if v is not None}
    for key, v in d.items():
        if key in HONOURED_SAMPLING or key in NO_EFFECT_SAMPLING:
            continue
        if key not in DEFAULT_ONLY_SAMPLING:
            raise RequestError(f"{where}.{key} is not an SGLang sampling parameter "
                               f"(the ones slick serve takes are listed in docs/serving.md)")
        default = DEFAULT_ONLY_SAMPLING[key]
        if not _is_default(v, default):
            raise RequestError(f"{where}.{key} = {_short(v)} is not supported by slick serve "
                               f"(only the default {default!r} is accepted)")
    for key in _BOOL_FIELDS:
        if key in d and not isinstance(d[key], bool):
            raise RequestError(f"{where}.{key} must be a boolean, got {_short(d[key])}")
    for key, kind in _NUMBER_FIELDS.items():
        v = d.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
            raise RequestError(f"{where}.{key} must be {'an integer' if kind is int else 'a number'}, got {v!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise RequestError(f"{where}.{key} must be finite, got {v!r}")
    stop = d.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestError(f"{where}.stop must be a string or a list of strings")
    sti = d.get("stop_token_ids")
    if sti is not None and not (isinstance(sti, list) and all(_is_int(t) for t in sti)):
        raise RequestError(f"{where}.stop_token_ids must be a list of integers")
    sp = SamplingParams.from_sglang(d)
    if sp.temperature < 0:
        raise RequestError(f"{where}.temperature must be >= 0, got {sp.temperature}")
    if not 0 < sp.top_p <= 1:
        raise RequestError(f"{where}.top_p must be in (0, 1], got {sp.top_p}")
    if sp.max_new_tokens < 0:
        raise RequestError(f"{where}.max_new_tokens must be >= 0, got {sp.max_new_tokens}")
    return validate_sampling(sp, where, error=RequestError)


def text_prompts(body: Any, *, max_batch: int = 4096, max_chars: Optional[int] = None) -> Optional[list[str]]:
    """The prompts of a ``/generate`` body that sends ``text`` (``None`` when it sends ``input_ids``).

    Checked before any tokenization, so an oversized request costs nothing: more than ``max_batch`` texts,
    or a text longer than ``max_chars`` characters, raise ``RequestError`` with status 413.
    """
    if not isinstance(body, dict):
        raise RequestError(f"request body must be a JSON object, got {type(body).__name__}")
    ids, text = body.get("input_ids"), body.get("text")
    if ids is not None:
        return None
    if text is None:
        raise RequestError("request needs 'input_ids' or 'text'")
    batched = isinstance(text, list)
    texts = text if batched else [text]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise RequestError("text must be a non-empty string or a list of strings")
    if len(texts) > max_batch:
        raise RequestError(f"batch of {len(texts)} prompts exceeds the limit of {max_batch} (--max-batch)",
                           status=413)
    if max_chars is not None:
        for i, t in enumerate(texts):
            if len(t) > max_chars:
                w = f"text[{i}]" if batched else "text"
                raise RequestError(f"{w} has {len(t)} characters; more than {max_chars} cannot fit the context "
                                   f"(longest token x (context - 1)), rejected before tokenizing", status=413)
    return texts


def text_char_limit(tokenizer, max_context: int) -> int:
    """Characters no text that fits the context can exceed: each token covers at most as many characters as
    its longest vocabulary entry has (byte-level BPE: bytes), and a prompt has at most ``max_context - 1``."""
    longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
    return max(1, longest) * max(1, max_context - 1)


def parse_generate(body: Any, *, vocab_size: int, max_context: int,
                   tokenize: Optional[Callable[[str], list[int]]] = None,
                   text_ids: Optional[list[list[int]]] = None, max_batch: int = 4096,
                   max_text_chars: Optional[int] = None) -> GenerateRequest:
    """Turn a decoded ``/generate`` JSON body into checked items; raises ``RequestError``.

    ``max_context`` bounds prompt length + ``max_new_tokens`` for every item. A ``text`` body is checked by
    :func:`text_prompts` and then tokenized with ``tokenize``, unless ``text_ids`` already holds its tokens.
    """
    prompts, batched, where = _prompts(body, tokenize, text_ids, max_batch, max_text_chars)
    if batched and not prompts:
        raise RequestError("input_ids batch is empty")
    if len(prompts) > max_batch:
        raise RequestError(f"batch of {len(prompts)} prompts exceeds the limit of {max_batch} (--max-batch)",
                           status=413)
    n = len(prompts)

    samplings, explicit = _samplings(body.get("sampling_params"), batched, n)
    rids = _rids(body.get("rid"), n)

    for i, p in enumerate(prompts):     # lengths before any per-token work
        if isinstance(p, list) and len(p) >= max_context:
            raise RequestError(f"{where.format(i)} has {len(p)} tokens; the context is {max_context}", status=413)
    items = []
    for i, (p, sp, rid) in enumerate(zip(prompts, samplings, rids)):
        w = where.format(i)
        p = _check_ids(p, w, vocab_size)
        if not explicit[i] and len(p) + sp.max_new_tokens > max_context:
            # the default (128) shrinks to fit; an explicit max_new_tokens beyond the context is an error
            sp = dataclasses.replace(sp, max_new_tokens=max_context - len(p))
        if len(p) + sp.max_new_tokens > max_context:
            raise RequestError(f"{w}: prompt {len(p)} + max_new_tokens {sp.max_new_tokens} exceeds the "
                               f"context of {max_context} tokens")
        items.append(GenerateItem(rid=rid, prompt_ids=p, sampling=sp))
    rl = body.get("return_logprob", False)
    if isinstance(rl, list):
        rl = any(rl)
    if not isinstance(rl, bool):
        raise RequestError(f"return_logprob must be a boolean, got {rl!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream must be a boolean, got {stream!r}")
    start, top = _input_logprob_fields(body, min(len(it.prompt_ids) for it in items))
    if rl and top:   # output_top_logprobs of every generated token too
        items = [dataclasses.replace(it, sampling=dataclasses.replace(it.sampling, top_logprobs_num=top))
                 for it in items]
    return GenerateRequest(items=items, batched=batched, return_logprob=rl, stream=stream,
                           logprob_start_len=start if rl else -1, top_logprobs_num=top)


def _prompts(body: dict, tokenize, text_ids, max_batch: int, max_text_chars) -> tuple[list, bool, str]:
    """``(prompts, batched, where)``: the body's ``input_ids``, or its ``text`` tokenized (``text_ids`` when the
    caller has them already); ``where`` names one prompt in errors (``where.format(i)``)."""
    texts = text_prompts(body, max_batch=max_batch, max_chars=max_text_chars)
    if texts is None:
        ids = body["input_ids"]
        if not isinstance(ids, list):
            raise RequestError(f"input_ids must be a list, got {type(ids).__name__}")
        batched = bool(ids) and isinstance(ids[0], list)
        return (ids if batched else [ids]), batched, ("input_ids[{}]" if batched else "input_ids")
    if text_ids is None:
        if tokenize is None:
            raise RequestError("this server cannot tokenize 'text'; send 'input_ids'")
        text_ids = [tokenize(t) for t in texts]
    if len(text_ids) != len(texts):
        raise ValueError(f"text_ids has {len(text_ids)} entries for {len(texts)} texts")
    batched = isinstance(body["text"], list)
    return text_ids, batched, ("text[{}] (tokenized)" if batched else "text (tokenized)")


def _samplings(sps, batched: bool, n: int) -> tuple[list, list]:
    """The ``n`` prompts' sampling parameters (one dict for all, or a list of ``n``), and whether each set
    ``max_new_tokens`` itself (an unset one shrinks to fit the context)."""
    if isinstance(sps, list):
        if not batched or len(sps) != n:
            raise RequestError(f"sampling_params list has {len(sps)} entries for {n} prompt(s)")
        return ([parse_sampling(s, f"sampling_params[{i}]") for i, s in enumerate(sps)],
                [isinstance(s, dict) and s.get("max_new_tokens") is not None for s in sps])
    return [parse_sampling(sps)] * n, [isinstance(sps, dict) and sps.get("max_new_tokens") is not None] * n


def _rids(rids, n: int) -> list[str]:
    """Request ids: given (a string, suffixed ``-i`` in a batch, or a list of ``n``) or fresh ones."""
    if rids is None:
        return [uuid.uuid4().hex for _ in range(n)]
    if isinstance(rids, str):
        return [rids] if n == 1 else [f"{rids}-{i}" for i in range(n)]
    if not (isinstance(rids, list) and len(rids) == n and all(isinstance(r, str) for r in rids)):
        raise RequestError(f"rid must be a string or a list of {n} strings")
    return rids


def _input_logprob_fields(body: dict, shortest: int) -> tuple[int, int]:
    """SGLang's top-level ``logprob_start_len`` (-1, the default: no prompt logprobs) and ``top_logprobs_num``
    (the prompt's top tokens per position, 0..20), checked."""
    start, top = body.get("logprob_start_len"), body.get("top_logprobs_num")
    start = -1 if start is None else start
    top = 0 if top is None else top
    if not _is_int(start) or start < -1 or start >= shortest:
        raise RequestError(f"logprob_start_len must be an integer in [-1, {shortest - 1}] (a position of the "
                           f"prompt), got {start!r}")
    if not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise RequestError(f"top_logprobs_num must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}")
    return start, top


def input_logprobs_json(prompt_ids: list[int], token_lps: list[float], top: list, start: int) -> dict:
    """SGLang's ``input_token_logprobs`` (``[logprob, token_id, null]`` per prompt position from ``start``, the
    logprob null at position 0) and, when ``top`` has candidates, ``input_top_logprobs`` (``[[logprob, token_id,
    null], ...]`` per position, null at position 0), from the engine's prompt logprobs (``token_lps[i]``, ``top[i]``
    predict ``prompt_ids[i + 1]``)."""
    out = {"input_token_logprobs": [[None if j == 0 else float(token_lps[j - 1]), int(prompt_ids[j]), None]
                                    for j in range(start, len(prompt_ids))]}
    if any(top):
        out["input_top_logprobs"] = [None if j == 0 else [[float(v), int(t), None] for t, v in top[j - 1]]
                                     for j in range(start, len(prompt_ids))]
    return out


def prompt_logprobs_from_json(meta: dict, ids: list[int]) -> list[dict]:
    """``[{token: logprob}]`` per position 0..n-2 of ``ids`` (the top tokens plus the one that follows) from the
    ``meta_info`` of a ``/generate`` answer asked with ``logprob_start_len`` 0 (slick serve or SGLang)."""
    tokens = meta.get("input_token_logprobs")
    if not isinstance(tokens, list) or len(tokens) != len(ids):
        n = len(tokens) if isinstance(tokens, list) else None
        raise ValueError(f"input_token_logprobs has {n} entries for a prompt of {len(ids)} tokens")
    tops = meta.get("input_top_logprobs") or [None] * len(ids)
    out = []
    for j in range(1, len(ids)):
        d = {int(t): float(lp) for lp, t, *_ in (tops[j] or [])}
        lp, t = tokens[j][0], int(tokens[j][1])
        if t != int(ids[j]) or lp is None:
            raise ValueError(f"input_token_logprobs[{j}] = {tokens[j]!r} does not score token {ids[j]}")
        d[t] = float(lp)
        out.append(d)
    return out


def _is_default(v: Any, default: Any) -> bool:
    if isinstance(v, bool):          # no default here is a boolean (and True == 1 must not pass for n)
        return False
    if default is None:
        return v in ("", [], {})
    return isinstance(v, (int, float)) and v == default


def _short(v: Any, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."


def finish_reason_json(gen: Generation, sampling: SamplingParams, message: str = "") -> dict:
    """SGLang's ``meta_info.finish_reason`` object for a generation."""
    kind = gen.finish_reason
    if kind == "length":
        return {"type": "length", "length": sampling.max_new_tokens}
    if kind == "stop":
        return {"type": "stop", "matched": gen.token_ids[-1] if gen.token_ids else None}
    return {"type": kind, "message": message or "request aborted"}


def generation_json(gen: Generation, item: GenerateItem, *, text: str, return_logprob: bool,
                    e2e_latency: float) -> dict:
    """One ``/generate`` response object in SGLang's shape."""
    meta = {
        "id": item.rid,
        "finish_reason": finish_reason_json(gen, item.sampling),
        "prompt_tokens": len(item.prompt_ids),
        "completion_tokens": len(gen.token_ids),
        "cached_tokens": 0,
        "weight_version": gen.weight_version,
        "e2e_latency": round(e2e_latency, 6),
    }
    if gen.weight_versions is not None:     # slick extension
        meta["output_token_weight_versions"] = [int(v) for v in gen.weight_versions]
    if return_logprob:
        meta["output_token_logprobs"] = [[float(lp), int(t), None] for lp, t in zip(gen.logprobs, gen.token_ids)]
        if gen.top_logprobs is not None:   # top_logprobs_num
            meta["output_top_logprobs"] = [[[float(v), int(t), None] for t, v in row] for row in gen.top_logprobs]
    return {"text": text, "output_ids": list(gen.token_ids), "meta_info": meta}


def parse_weight_version(v: Any, default: int = 0) -> int:
    """SGLang reports weight versions as strings ("default", "3"); slick uses integers."""
    if _is_int(v):
        return v
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return default


def generation_from_json(d: dict) -> Generation:
    """Parse one SGLang ``/generate`` response object (from slick serve, SGLang or sglang-router)."""
    if not isinstance(d, dict) or "meta_info" not in d:
        raise ValueError(f"not a /generate response: {str(d)[:200]}")
    meta = d["meta_info"]
    lps = meta.get("output_token_logprobs") or []
    ids = d.get("output_ids")
    if ids is None:
        ids = [int(x[1]) for x in lps]
    logprobs = [float(x[0]) if x[0] is not None else float("nan") for x in lps]
    fr = meta.get("finish_reason")
    kind = fr.get("type") if isinstance(fr, dict) else (fr or "stop")
    if kind not in ("stop", "length", "abort"):
        kind = "abort" if kind in ("cancelled", "error") else "stop"
    version = parse_weight_version(meta.get("weight_version"))
    versions = meta.get("output_token_weight_versions")     # slick serve; SGLang: one version for the request
    if versions is None:
        versions = [version] * len(ids)
    elif len(versions) != len(ids):
        raise ValueError(f"output_token_weight_versions has {len(versions)} entries for {len(ids)} tokens")
    tops = meta.get("output_top_logprobs")    # asked with top_logprobs_num: [[logprob, token_id, text], ...]
    if tops is not None:
        if len(tops) != len(ids):
            raise ValueError(f"output_top_logprobs has {len(tops)} entries for {len(ids)} tokens")
        tops = [[(int(t), float(lp)) for lp, t, *_ in row or []] for row in tops]
    return Generation(token_ids=[int(t) for t in ids], logprobs=logprobs, finish_reason=kind,
                      weight_version=version, prompt_tokens=int(meta.get("prompt_tokens", 0)),
                      text=d.get("text"), weight_versions=[int(v) for v in versions], top_logprobs=tops)

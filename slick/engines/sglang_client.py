"""SglangEngine: HttpEngine for real SGLang servers (``--rollout-engine sglang``; docs/sglang.md).

SGLang's native API is the one ``HttpEngine`` speaks; what differs between releases is handled here:

* **weight versions.** ``/get_weight_version`` is gone in SGLang 0.5.23 (404); ``/get_model_info`` reports
  ``weight_version``. Each server's route is detected once (the first that answers; a 404 moves on to the next, and
  a server where none reports a version is an error naming it), never assumed.
* **weight sync verified.** After ``/update_weights_from_disk`` every server must report the new version, or the
  sync fails naming the server and what it reports. The prefix cache is flushed with the update unless every server
  runs without one (``--disable-radix-cache``, as slick's CPU servers do): SGLang refuses a flush while requests
  are in flight, and a request paused in place across an update is what partial rollouts need.
* **pause / continue** answer ``{"status": "ok"}`` (SGLang) or ``{"success": true}`` (``slick serve``); any other
  answer is an error naming the server.
* **per-token versions.** SGLang reports ``meta_info.weight_versions`` as ranges (``[{"version": "3", "start": 0,
  "end": 5}, ...]``): a request that a weight update paused in place carries each token's version.
* **streams.** SGLang's streamed chunks are cumulative (each holds every token so far); a partial chunk replaces
  what the request had received (``--use-fault-tolerance`` resubmits from it).
* **grammars.** ``json_schema``, ``regex`` and ``ebnf`` go as SGLang's own ``sampling_params`` keys (servers slick
  launches run llguidance, whose Lark slick's grammars are); a JSON schema carries llguidance's compact-JSON
  options (``x-guidance``, the schema's own win), as slick's engine applies them: without them a random model
  filled the object with whitespace until ``max_new_tokens``.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Iterable, Optional

from slick.engine.grammar import compact_schema
from slick.engines.client import EngineError, HttpEngine
from slick.engines.flight import Flight, Retryable, norm_url
from slick.serve.http_protocol import generation_from_json, parse_weight_version
from slick.types import Generation, SamplingParams

VERSION_ROUTES = ("/get_weight_version", "/get_model_info")


class SglangEngine(HttpEngine):
    """HttpEngine over real SGLang servers (module doc); the constructor is HttpEngine's."""

    def __init__(self, urls, **kw):
        super().__init__(urls, **kw)
        self._version_route: dict[str, str] = {}     # server url -> the route that reports its weight version
        self._no_radix: dict[str, bool] = {}         # server url -> it runs without a prefix cache

    def _payload(self, prompt_ids: list[int], sampling: SamplingParams, rid: str, stream: bool) -> dict:
        body = super()._payload(prompt_ids, sampling, rid, stream)
        sp = body["sampling_params"]
        if isinstance(sp.get("json_schema"), str):
            sp["json_schema"] = compact_json_text(sp["json_schema"])
        return body

    def _parse(self, out: Any) -> Generation:
        return generation_from_json(token_versions(out[0] if isinstance(out, list) else out))

    def _chunk(self, out: Any, flight: Flight) -> Optional[Generation]:
        """One streamed chunk; a partial one (cumulative, without ``output_offset``) replaces what ``flight`` has."""
        out = token_versions(out[0] if isinstance(out, list) else out)
        meta = out.get("meta_info", {})
        if meta.get("finish_reason") is not None or "output_offset" in meta:
            return super()._chunk(out, flight)
        gen = generation_from_json(out)
        flight.tokens, flight.logprobs, flight.versions = list(gen.token_ids), list(gen.logprobs), \
            list(gen.weight_versions)
        return None

    async def _version_answer(self, url: str, timeout: float) -> tuple[str, Any]:
        """(route, its JSON answer) of the route that reports ``url``'s weight version (detected once)."""
        url = norm_url(url)
        known = self._version_route.get(url)
        tried = []
        for route in ([known] if known else VERSION_ROUTES):
            try:
                out = await self._call("GET", url, route, timeout=timeout)
            except Retryable as e:
                raise EngineError(f"worker {url} did not answer {route}: {e}") from None
            except EngineError as e:
                if "HTTP 404" in str(e) and not known:
                    tried.append(f"{route}: 404")
                    continue
                raise
            if isinstance(out, dict) and "weight_version" in out:
                self._version_route[url] = route
                return route, out
            tried.append(f"{route}: no weight_version in {str(out)[:120]}")
        raise EngineError(f"worker {url} reports no weight version ({'; '.join(tried)})")

    async def weight_version_of(self, url: str, timeout: float = 30.0) -> int:
        """The weight version server ``url`` reports (-1 for a name that is not a number, such as "default")."""
        _, out = await self._version_answer(url, timeout)
        return parse_weight_version(out.get("weight_version"), default=-1)

    async def get_weight_version(self) -> int:
        """The weight version the first control server reports (and the engine's own when it reports none)."""
        v = await self.weight_version_of(self.control_urls[0])
        if v >= 0:
            self._version = v
        return self._version

    async def update_weights(self, named_tensors: Optional[Iterable] = None, path: Optional[str] = None,
                             version: Optional[int] = None) -> int:
        """``/update_weights_from_disk`` on every server, then every server that answered must report the new
        version (EngineError naming the ones that do not). Returns the new version (``version``, else the last
        one + 1)."""
        if named_tensors is not None or path is None:
            raise EngineError("SglangEngine.update_weights needs path=<HF dir the servers can read>")
        new = int(version) if version is not None else self._version + 1
        payload = {"model_path": str(path), "weight_version": str(new), "flush_cache": await self._flush()}
        outs = await self._broadcast("POST", "/update_weights_from_disk", payload)
        urls = list(self._answered)
        bad = [f"{u}: {o}" for u, o in zip(urls, outs) if not (isinstance(o, dict) and o.get("success"))]
        if bad:
            raise EngineError("update_weights_from_disk refused by " + "; ".join(bad))
        got = await asyncio.gather(*(self.weight_version_of(u) for u in urls))
        wrong = [f"{u} reports {v}" for u, v in zip(urls, got) if v != new]
        if wrong:
            raise EngineError(f"weight update to version {new} did not land on every server: " + ", ".join(wrong))
        self._version = new
        return new

    async def load_weights_at(self, url: str, path: str, version: int, timeout: Optional[float] = None) -> None:
        """Load ``path`` as ``version`` into the one server ``url`` and check that it reports ``version``."""
        await self.control(url, "/update_weights_from_disk", {"model_path": str(path), "weight_version": str(version),
                                                               "flush_cache": await self._flush([url])},
                           timeout=timeout)
        got = await self.weight_version_of(url)
        if got != int(version):
            raise EngineError(f"{url} loaded {path} but reports weight version {got}, not {version}")

    async def _flush(self, urls: Optional[list] = None) -> bool:
        """Whether an update must flush the servers' prefix cache: yes unless every server runs without one
        (``disable_radix_cache`` in ``/get_server_info``; slick's CPU servers). SGLang refuses to flush while
        requests are in flight, so only servers without a prefix cache take an update under an in-place pause."""
        for url in urls or self.control_urls:
            if url not in self._no_radix:
                info = await self._get(url, "/get_server_info", 30.0)
                self._no_radix[url] = bool(isinstance(info, dict) and info.get("disable_radix_cache"))
            if not self._no_radix[url]:
                return True
        return False

    async def pause_generation(self) -> None:
        """``/pause_generation {"mode": "in_place"}`` on every server; each must say it paused."""
        _check_ok("/pause_generation", self._answered_with(
            await self._broadcast("POST", "/pause_generation", {"mode": "in_place"})))

    async def continue_generation(self) -> None:
        """``/continue_generation`` on every server; each must say it continued."""
        _check_ok("/continue_generation", self._answered_with(
            await self._broadcast("POST", "/continue_generation", {})))

    def _answered_with(self, outs: list) -> list[tuple[str, Any]]:
        return list(zip(self._answered, outs))


def compact_json_text(text: str) -> str:
    """A JSON schema's text with llguidance's compact-JSON options in it (unchanged when it is not a JSON object:
    the server names the bad schema in its error)."""
    try:
        schema = json.loads(text)
    except ValueError:
        return text
    return json.dumps(compact_schema(schema), ensure_ascii=False) if isinstance(schema, dict) else text


def token_versions(out: Any) -> Any:
    """``out`` (one /generate answer) with ``meta_info.output_token_weight_versions`` expanded from SGLang's
    ``weight_versions`` ranges when they cover every output token; otherwise unchanged."""
    meta = out.get("meta_info") if isinstance(out, dict) else None
    if not isinstance(meta, dict) or "output_token_weight_versions" in meta or \
            not isinstance(meta.get("weight_versions"), list):
        return out
    n = len(out.get("output_ids") or meta.get("output_token_logprobs") or [])
    versions: list = []
    for r in meta["weight_versions"]:
        if not isinstance(r, dict) or int(r.get("start", -1)) != len(versions):
            return out
        versions += [parse_weight_version(r.get("version"))] * (int(r.get("end", 0)) - int(r["start"]))
    if len(versions) != n:
        return out
    return {**out, "meta_info": {**meta, "output_token_weight_versions": versions}}


def _check_ok(path: str, answers: list[tuple[str, Any]]) -> None:
    """Every answer says ``"status": "ok"`` or ``"success": true``; EngineError naming the server otherwise."""
    bad = [f"{u}: {str(o)[:200]}" for u, o in answers
           if not (isinstance(o, dict) and (o.get("success") is True or o.get("status") == "ok"))]
    if bad:
        raise EngineError(f"{path} was not acknowledged by " + "; ".join(bad))

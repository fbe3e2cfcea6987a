"""HttpEngine: the Engine protocol over SGLang's native HTTP API.

Drives ``slick serve`` workers, real SGLang servers, or an sglang-router in front of either::

    engine = HttpEngine(["http://127.0.0.1:30000", "http://127.0.0.1:30001"])
    gen = await engine.generate(prompt_ids, SamplingParams(max_new_tokens=32))
    await engine.update_weights(path="/ckpt/step_3", version=3)

Requests go round-robin over ``urls``; a connection error or a 5xx moves the request to the next
worker (at most ``max_retries`` retries). When no worker answers, ``EngineError`` is raised; for servers slick
launched (``server_logs``: url -> their log files) it quotes the last lines of their logs, where the cause is.
Control calls (``update_weights``, ``abort``, ``abort_all``, ``pause_generation``, ``continue_generation``)
go to every URL of ``control_urls`` (default: ``urls``); behind a router, pass the workers' URLs there.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from typing import Any, Iterable, Optional

import aiohttp

from slick.engines.answer_check import AnswerError, check_generation, check_logprob_rows, decode_body
from slick.engines.fault import PartialGeneration
from slick.engines.flight import Failed, Flight, Retryable, error_message, norm_url, unless
from slick.engines.launch_ready import log_tail
from slick.engines.weight_calls import WeightGroupCalls
from slick.serve.http_protocol import generation_from_json, parse_weight_version, prompt_logprobs_from_json
from slick.serve.routing_wire import record_from_wire
from slick.types import Generation, SamplingParams

log = logging.getLogger("slick.engine")


class EngineError(RuntimeError):
    """An engine could not serve a request (all workers down, or the server refused it)."""


class HttpEngine(WeightGroupCalls):
    """Engine protocol over HTTP (see module docstring).

    ``concurrency`` bounds requests in flight from this client; ``timeout`` is per request (seconds).
    The aiohttp session is created lazily, once per event loop.
    """

    def __init__(self, urls: list[str], *, api_key: Optional[str] = None, concurrency: int = 256,
                 timeout: float = 600.0, max_retries: int = 3, control_urls: Optional[list[str]] = None,
                 server_logs: Optional[dict[str, list[str]]] = None, routing: Optional[tuple[int, int]] = None):
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("HttpEngine needs at least one URL")
        self.urls = [norm_url(u) for u in urls]
        self.control_urls = [norm_url(u) for u in (control_urls or urls)]
        self.api_key = api_key
        self.concurrency = int(concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.server_logs = {norm_url(u): list(paths) for u, paths in (server_logs or {}).items()}
        self._rr = itertools.count()
        self._down: dict[str, float] = {}     # url -> time it last failed
        self._session: Optional[aiohttp.ClientSession] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._version = 0
        self.num_retries = 0                  # requests moved to another worker after a failure
        # --use-fault-tolerance (slick/engines/fault.py): generation streams, so a request whose worker fails goes
        # on on another one from the tokens already received; set by the factory
        self.fault_tolerant = False
        self.routed = self.urls != self.control_urls    # generation goes through a router
        self.resubmitted = 0                  # requests moved to another worker after their worker failed
        self._flights: dict[str, Flight] = {}
        self._current: dict[str, str] = {}              # rid asked for -> rid of its attempt now in flight
        self._lost: dict[str, asyncio.Event] = {}       # worker url -> set when it was declared failed
        # routing replay on a mixture-of-experts model: (MoE layers, experts per token) of its config.json; every
        # generation asks for its routed experts (SGLang's return_routed_experts) and carries them as slick's
        # record (Generation.routed_experts; slick/serve/routing_wire.py)
        self.routing = None if routing is None else (int(routing[0]), int(routing[1]))

    @property
    def weight_urls(self) -> list[str]:
        """Alias of ``control_urls``: where weight updates and aborts are sent."""
        return self.control_urls

    @weight_urls.setter
    def weight_urls(self, urls: list[str]) -> None:
        self.control_urls = [norm_url(u) for u in urls]

    # ---------------------------------------------------------- plumbing
    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _ensure(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # A session belongs to one loop; a new loop (e.g. another asyncio.run) gets a new one.
            conn = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency)
            self._session = aiohttp.ClientSession(connector=conn, headers=self._headers())
            self._sem = asyncio.Semaphore(self.concurrency)
            self._loop = loop
        return self._session, self._sem

    def _order(self) -> list[str]:
        """Workers to try for one request: round-robin start, recently failed ones last."""
        k = next(self._rr) % len(self.urls)
        ring = self.urls[k:] + self.urls[:k]
        now = time.monotonic()
        return [u for u in ring if now - self._down.get(u, -1e9) > 5.0] + \
               [u for u in ring if now - self._down.get(u, -1e9) <= 5.0]

    async def _call(self, method: str, url: str, path: str, payload: Any = None,
                    timeout: Optional[float] = None) -> Any:
        session, _ = self._ensure()
        to = aiohttp.ClientTimeout(total=timeout or self.timeout)
        if payload is None and method != "GET":
            payload = {}     # a POST always says Content-Type: application/json (control endpoints need it)
        try:
            async with session.request(method, url + path, json=payload, timeout=to) as resp:
                raw = await resp.read()
                text = raw.decode("utf-8", errors="replace")
                if resp.status >= 500 or resp.status == 429:
                    raise Retryable(f"{url}{path}: HTTP {resp.status}: {text[:300]}")
                if resp.status >= 400:
                    raise EngineError(f"{url}{path}: HTTP {resp.status}: {error_message(text)}")
                try:   # an answer the run uses: UTF-8 and, when it says so, JSON (slick.engines.answer_check)
                    text = decode_body(raw)
                    if not text.strip():
                        return None
                    ctype = resp.headers.get("Content-Type", "")
                    if "json" in ctype or text.lstrip()[:1] in "{[":
                        return json.loads(text)
                    return text
                except (ValueError, RecursionError) as e:
                    raise EngineError(f"{url}{path}: {e}") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as e:
            raise Retryable(f"{url}{path}: {type(e).__name__}: {e}") from e
        except asyncio.TimeoutError:
            raise EngineError(f"{url}{path}: no answer within {to.total:.0f}s (timeout)") from None

    async def _request(self, method: str, path: str, payload: Any = None, parse=None) -> Any:
        """Send to one worker, retrying on others after connection errors / 5xx; returns ``parse(answer)`` when given
        (its ValueError, KeyError, TypeError, IndexError: an EngineError naming the worker that answered)."""
        _, sem = self._ensure()
        errors, failed = [], []
        order = self._order()
        async with sem:
            for attempt in range(self.max_retries + 1):
                url = order[attempt % len(order)]
                try:
                    out = await self._call(method, url, path, payload)
                    self._down.pop(url, None)
                    try:
                        return out if parse is None else parse(out)
                    except (ValueError, KeyError, TypeError, IndexError) as e:
                        raise EngineError(f"{url}{path}: unusable answer: {type(e).__name__}: {e}") from None
                except Retryable as e:
                    self._down[url] = time.monotonic()
                    self.num_retries += 1
                    errors.append(str(e))
                    failed.append(url)
                    if attempt < self.max_retries:
                        await asyncio.sleep(min(0.05 * 2 ** attempt, 1.0))
        raise EngineError(f"no worker could serve {path} after {len(errors)} attempt(s) over "
                          f"{len(self.urls)} worker(s): " + " | ".join(errors[-4:]) + self.logs_of(failed))

    def logs_of(self, urls: Iterable[str]) -> str:
        """The last lines of the logs of the launched servers among ``urls`` (empty for servers slick did not
        start): an engine that answers 500 or drops the connection says why only there."""
        paths = dict.fromkeys(p for u in urls for p in self.server_logs.get(u, ()))
        return "".join(f"\nlast lines of {p}:\n{log_tail(p)}" for p in paths)

    async def _broadcast(self, method: str, path: str, payload: Any = None) -> list[Any]:
        """Send to every control URL (no fail-over: each one must answer). With fault tolerance a worker that
        fails or is declared failed meanwhile is left out (its replacement is brought up to date on its own),
        as long as one worker answers."""
        self._ensure()
        urls = list(self.control_urls)

        async def one(url):
            try:
                if not self.fault_tolerant:
                    return await self._call(method, url, path, payload)
                return await unless(self._call(method, url, path, payload), self._lost_event(url))
            except Retryable as e:
                if self.fault_tolerant:
                    return Failed(url, str(e))
                raise EngineError(f"worker {url} did not answer {path}: {e}") from None

        outs = list(await asyncio.gather(*(one(u) for u in urls)))
        if self.fault_tolerant:
            failed = [o for o in outs if isinstance(o, Failed)]
            if len(failed) == len(outs):
                raise EngineError(f"no worker answered {path}: " + " | ".join(f.error for f in failed))
            for f in failed:
                log.warning("worker %s left out of %s (fault tolerance): %s", f.url, path, f.error)
            keep = [(u, o) for u, o in zip(urls, outs) if not isinstance(o, Failed)]
            self._answered = [u for u, _ in keep]
            return [o for _, o in keep]
        self._answered = urls
        return outs

    # ------------------------------------------------- the wire format (a subclass speaks another)
    generate_path = "/generate"
    health_path = "/health_generate"    # answers 200 only when the worker can generate (the health monitor's probe)

    def _payload(self, prompt_ids: list[int], sampling: SamplingParams, rid: str, stream: bool) -> dict:
        """The body of one generate request (SGLang's native API)."""
        out = {"input_ids": prompt_ids, "sampling_params": sampling.to_sglang(), "return_logprob": True,
               "stream": stream, "rid": rid}
        if sampling.top_logprobs_num:     # SGLang's field: meta_info.output_top_logprobs per token
            out["top_logprobs_num"] = sampling.top_logprobs_num
        if self.routing is not None:      # every position from 0: a resubmitted prompt holds the earlier tokens
            out["return_routed_experts"] = True
        return out

    def _with_routing(self, out: Any, gen: Generation) -> Generation:
        """``gen`` with the routed experts of answer ``out`` as slick's record (when this engine asks for them;
        an answer without them leaves ``routed_experts`` None, which the trainer counts as a missing record)."""
        if self.routing is None:
            return gen
        meta = (out[0] if isinstance(out, list) else out).get("meta_info") or {}
        if meta.get("routed_experts") is not None:
            gen.routed_experts = record_from_wire(meta["routed_experts"], *self.routing)
        return gen

    def _parse(self, out: Any) -> Generation:
        """A non-streamed generate answer as a Generation."""
        return generation_from_json(out[0] if isinstance(out, list) else out)

    def _chunk(self, out: Any, flight: "Flight") -> Optional[Generation]:
        """One streamed chunk: a partial one goes into ``flight`` (None is returned), the final one is returned."""
        out = out[0] if isinstance(out, list) else out
        meta = out.get("meta_info", {})
        if meta.get("finish_reason") is None:    # a partial chunk: the tokens since the last one
            flight.extend(generation_from_json(out), int(meta.get("output_offset", 0)))
            return None
        return generation_from_json(out)

    # ------------------------------------------------------------ Engine
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       rid: Optional[str] = None) -> Generation:
        """POST /generate with ``return_logprob`` and ``rid`` (a fresh uuid when None); returns tokens, logprobs,
        finish reason, version, and per-token versions (``output_token_weight_versions``, else the request's
        version), checked (``slick.engines.answer_check``). ``fault_tolerant``: streamed, surviving its worker."""
        rid = uuid.uuid4().hex if rid is None else rid
        if self.fault_tolerant:
            gen = await self._generate_ft(prompt_ids, sampling, rid)
            try:
                check_generation(gen)
            except AnswerError as e:
                raise EngineError(f"{' or '.join(self.urls)}{self.generate_path}: unusable answer: {e}") from None
            return gen
        payload = self._payload(list(prompt_ids), sampling, rid, stream=False)
        gen = await self._request("POST", self.generate_path, payload, parse=self._checked)
        if not gen.prompt_tokens:
            gen.prompt_tokens = len(prompt_ids)
        self._version = max(self._version, gen.weight_version)
        return gen

    def _checked(self, out: Any) -> Generation:
        """:meth:`_parse`, then the checks of ``slick.engines.answer_check`` (one finite logprob <= 0 per token)."""
        gen = self._with_routing(out, self._parse(out))
        check_generation(gen)
        return gen

    async def prompt_top_logprobs(self, token_ids: list[int], k: int) -> list[dict]:
        """``[{token: logprob}]`` for positions 0..n-2 of ``token_ids``: the top-``k`` next-token logprobs plus the
        token that follows (``VllmEngine.prompt_top_logprobs``' contract), from SGLang's prompt logprobs
        (``logprob_start_len`` 0, ``max_new_tokens`` 0; slick serve computes them at temperature 1)."""
        body = {"input_ids": list(token_ids), "return_logprob": True, "logprob_start_len": 0,
                "top_logprobs_num": int(k), "sampling_params": {"max_new_tokens": 0, "temperature": 1.0},
                "rid": f"prompt-logprobs-{uuid.uuid4().hex}"}
        def parse(out):
            rows = prompt_logprobs_from_json((out[0] if isinstance(out, list) else out)["meta_info"], token_ids)
            check_logprob_rows(rows)
            return rows
        return await self._request("POST", "/generate", body, parse=parse)

    # ------------------------------------------------------- fault tolerance
    async def _generate_ft(self, prompt_ids: list[int], sampling: SamplingParams, rid: str) -> Generation:
        """Stream the generation; when its worker fails (connection lost, stream cut, or declared failed by the
        health monitor), resubmit prompt + tokens so far to a healthy worker with the tokens left, keeping the
        logprobs and versions received. Bounded by ``timeout`` in all (EngineError names the rid)."""
        _, sem = self._ensure()
        part = PartialGeneration()
        deadline = time.monotonic() + self.timeout
        errors: list[str] = []
        failed: list[str] = []
        attempt = 0
        async with sem:
            while True:
                rid_now = rid if attempt == 0 else f"{rid}.r{attempt}"
                url = self._order()[0]
                flight = Flight(url, asyncio.Event())
                self._flights[rid_now] = flight
                self._current[rid] = rid_now
                payload = self._payload(part.prompt(prompt_ids), part.sampling(sampling), rid_now, stream=True)
                try:
                    gen = await unless(self._stream(url, payload, flight, deadline), flight.lost)
                    part.add(gen)
                    self._version = max(self._version, gen.weight_version)
                    return part.result(gen, len(prompt_ids))
                except Retryable as e:
                    errors.append(str(e))
                    failed.append(url)
                    self._down[url] = time.monotonic()
                finally:
                    self._flights.pop(rid_now, None)
                    if self._current.get(rid) == rid_now:
                        del self._current[rid]
                part.add_tokens(*flight.received(), sampling)   # a constrained one starts over
                attempt += 1
                self.resubmitted += 1
                if part.tokens and part.left(sampling) <= 0:   # everything arrived but the final chunk
                    return part.result(Generation([], [], "length", self._version, 0, weight_versions=[]),
                                       len(prompt_ids))
                if time.monotonic() >= deadline:
                    raise EngineError(f"request {rid} could not finish within {self.timeout:g}s over "
                                      f"{attempt} attempt(s): " + " | ".join(errors[-4:]) + self.logs_of(failed))
                await asyncio.sleep(min(0.05 * 2 ** min(attempt, 5), 1.0))

    async def _stream(self, url: str, payload: dict, flight: "Flight", deadline: float) -> Generation:
        """POST a streaming /generate to ``url``; partial chunks are kept in ``flight``; returns the final one."""
        session, _ = self._ensure()
        to = aiohttp.ClientTimeout(total=max(deadline - time.monotonic(), 0.1))
        try:
            async with session.post(url + self.generate_path, json=payload, timeout=to) as resp:
                if resp.status >= 500 or resp.status == 429:
                    raise Retryable(f"{url}{self.generate_path}: HTTP {resp.status}: {(await resp.text())[:300]}")
                if resp.status >= 400:
                    raise EngineError(f"{url}{self.generate_path}: HTTP {resp.status}: "
                                      f"{error_message(await resp.text())}")
                buf = b""
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        data = event.decode().strip()
                        if not data.startswith("data:"):
                            continue
                        data = data[5:].strip()
                        if data == "[DONE]":
                            break
                        out = json.loads(data)
                        gen = self._chunk(out, flight)
                        if gen is not None:
                            return self._with_routing(out, gen)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as e:
            raise Retryable(f"{url}{self.generate_path}: {type(e).__name__}: {e}") from e
        except asyncio.TimeoutError:
            raise EngineError(f"{url}{self.generate_path}: no answer within {to.total:.0f}s (timeout)") from None
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise EngineError(f"could not parse a {self.generate_path} stream chunk from {url}: {e}") from None
        raise Retryable(f"{url}{self.generate_path}: the stream ended before its final chunk")

    def _lost_event(self, url: str) -> asyncio.Event:
        return self._lost.setdefault(url, asyncio.Event())

    def remove_worker(self, url: str) -> None:
        """Take worker ``url`` out of the control URLs (and the generation URLs when there is no router)."""
        url = norm_url(url)
        self._lost_event(url).set()
        self.control_urls = [u for u in self.control_urls if u != url]
        if not self.routed:
            self.urls = [u for u in self.urls if u != url] or self.urls

    def add_worker(self, url: str) -> None:
        """Add worker ``url`` to the control URLs (and the generation URLs when there is no router)."""
        url = norm_url(url)
        self._lost.pop(url, None)
        if url not in self.control_urls:
            self.control_urls.append(url)
        if not self.routed and url not in self.urls:
            self.urls.append(url)
        self._down.pop(url, None)
        if not self.routed and self.urls and self.urls[0] not in self.control_urls:   # the last one had failed
            self.urls = [u for u in self.urls if u in self.control_urls]

    async def lose_worker(self, url: str) -> int:
        """Interrupt the requests worker ``url`` was serving (they resubmit themselves); returns how many.
        Behind a router the client does not know where a request went: those that no surviving worker has in
        flight (``/get_server_info`` ``inflight_tokens``) are interrupted."""
        url = norm_url(url)
        if not self.routed:
            hit = [f for f in self._flights.values() if f.url == url]
        else:
            alive: set = set()
            for u in self.control_urls:
                try:
                    info = await self._call("GET", u, "/get_server_info", timeout=10)
                    alive |= set((info or {}).get("inflight_tokens", {}))
                except (EngineError, Retryable):
                    pass
            hit = [f for rid, f in list(self._flights.items()) if rid not in alive]
        for f in hit:
            f.lost.set()
        return len(hit)

    def inflight(self) -> dict:
        """``{rid: worker url}`` of the requests in flight (fault-tolerant mode; the router's URL behind one)."""
        return {rid: f.url for rid, f in self._flights.items()}

    async def weight_version_of(self, url: str, timeout: float = 30.0) -> int:
        """The weight version worker ``url`` reports (GET /get_weight_version)."""
        out = await self._get(url, "/get_weight_version", timeout)
        return parse_weight_version(out.get("weight_version") if isinstance(out, dict) else None, default=-1)

    async def _get(self, url: str, path: str, timeout: float) -> Any:
        """GET ``path`` from one worker (no fail-over); EngineError naming it when it does not answer."""
        try:
            return await self._call("GET", norm_url(url), path, timeout=timeout)
        except Retryable as e:
            raise EngineError(f"worker {url} did not answer {path}: {e}") from None

    async def update_weights(self, named_tensors: Optional[Iterable] = None, path: Optional[str] = None,
                             version: Optional[int] = None) -> int:
        """POST /update_weights_from_disk to every control URL; returns the new weight version.

        Only ``path`` (a Hugging Face safetensors directory readable by the workers) works over HTTP.
        """
        if named_tensors is not None or path is None:
            raise EngineError("HttpEngine.update_weights needs path=<HF dir the workers can read>; "
                              "save the weights there first (named_tensors cannot travel over HTTP)")
        payload = {"model_path": str(path)}
        if version is not None:
            payload["weight_version"] = str(int(version))
        outs = await self._broadcast("POST", "/update_weights_from_disk", payload)
        versions = []
        for url, o in zip(self._answered, outs):
            if not isinstance(o, dict) or not o.get("success", False):
                raise EngineError(f"{url} refused update_weights_from_disk: {o}")
            versions.append(parse_weight_version(o.get("weight_version"), default=-1))
        known = [v for v in versions if v >= 0]
        new = int(version) if version is not None else (max(known) if known else self._version + 1)
        self._version = new
        return new

    async def accepts_adapters(self) -> bool:
        """Whether every worker merges a PEFT adapter directory given to ``/update_weights_from_disk`` (``slick serve``
        says ``"engine": "slick"`` in ``/get_model_info``; SGLang does not, and gets merged weights)."""
        infos = await asyncio.gather(*(self._get(u, "/get_model_info", 30.0) for u in self.control_urls))
        return all(isinstance(i, dict) and i.get("engine") == "slick" for i in infos)

    async def load_weights_at(self, url: str, path: str, version: int, timeout: Optional[float] = None) -> None:
        """Load the weights directory ``path`` as ``version`` into the one worker ``url`` (a replacement worker
        catching up; ``/update_weights_from_disk``)."""
        await self.control(url, "/update_weights_from_disk", {"model_path": str(path), "weight_version": str(version)},
                           timeout=timeout)

    async def control(self, url: str, path: str, payload: Any = None, timeout: Optional[float] = None) -> dict:
        """POST ``payload`` to ``path`` on one worker ``url`` (no fail-over) and return its JSON answer, which must
        say ``"success": true``; otherwise ``EngineError`` naming the URL (also for no answer within ``timeout``)."""
        try:
            out = await self._call("POST", norm_url(url), path, payload, timeout=timeout)
        except Retryable as e:
            raise EngineError(f"worker {url} did not answer {path}: {e}") from None
        if not isinstance(out, dict) or not out.get("success", False):
            raise EngineError(f"{url}{path} failed: {out}")
        return out

    async def abort_all(self) -> None:
        """POST /abort_request (abort all) to every control URL; unreachable workers are skipped."""
        await self._abort({"rid": "", "abort_all": True})

    async def abort(self, rid: str) -> None:
        """POST /abort_request ``{"rid": rid}`` to every control URL (the worker serving it aborts it: it answers
        with its tokens so far and finish reason "abort"; the others do nothing). Unreachable workers are
        skipped; an unknown or finished rid is a no-op."""
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"rid must be a non-empty string, got {rid!r}")
        await self._abort({"rid": self._current.get(rid, rid)})

    async def _abort(self, payload: dict) -> None:
        await self._abort_at("/abort_request", payload)

    async def _abort_at(self, path: str, payload: dict) -> None:
        self._ensure()
        results = await asyncio.gather(*(self._call("POST", u, path, payload, timeout=30)
                                         for u in self.control_urls), return_exceptions=True)
        for r in results:
            if isinstance(r, EngineError):
                raise r

    async def pause_generation(self) -> None:
        """POST /pause_generation ``{"mode": "in_place"}`` to every control URL: when it returns, no worker runs
        a decode step until :meth:`continue_generation`; requests in flight keep their state, new ones wait.
        Every worker must answer (``EngineError`` names the one that did not)."""
        await self._broadcast("POST", "/pause_generation", {"mode": "in_place"})

    async def continue_generation(self) -> None:
        """POST /continue_generation to every control URL."""
        await self._broadcast("POST", "/continue_generation", {})

    async def health(self) -> bool:
        """True when at least one generation URL answers GET /health with 200."""
        report = await self.health_report()
        return any(report.values())

    async def health_report(self, timeout: float = 5.0) -> dict[str, bool]:
        """``{url: healthy}`` for every generation URL."""
        self._ensure()

        async def one(url):
            try:
                await self._call("GET", url, "/health", timeout=timeout)
                return True
            except (EngineError, Retryable, asyncio.TimeoutError):
                return False

        return dict(zip(self.urls, await asyncio.gather(*(one(u) for u in self.urls))))

    async def get_weight_version(self) -> int:
        """Weight version reported by the workers (GET /get_weight_version, else /get_model_info)."""
        try:
            out = await self._request("GET", "/get_weight_version")
        except EngineError:
            out = await self._request("GET", "/get_model_info")
        v = parse_weight_version(out.get("weight_version") if isinstance(out, dict) else None, default=-1)
        if v >= 0:
            self._version = v
        return self._version

    async def close(self) -> None:
        """Close the pooled HTTP session (a later call opens a new one)."""
        if self._session is not None and not self._session.closed:
            try:
                await self._session.close()
            except RuntimeError:  # session from a loop that is gone
                pass
        self._session = None

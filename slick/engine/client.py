"""HttpEngine: the Engine protocol over SGLang's native HTTP API.

Drives ``slick serve`` workers, real SGLang servers, or an sglang-router in front of either::

    engine = HttpEngine(["http://127.0.0.1:30000", "http://127.0.0.1:30001"])
    gen = await engine.generate(prompt_ids, SamplingParams(max_new_tokens=32))
    await engine.update_weights(path="/ckpt/step_3", version=3)

Requests go round-robin over ``urls``; a connection error or a 5xx moves the request to the next
worker (at most ``max_retries`` retries). When no worker answers, ``EngineError`` is raised.
Control calls (``update_weights``, ``abort``, ``abort_all``, ``pause_generation``, ``continue_generation``)
go to every URL of ``control_urls`` (default: ``urls``); behind a router, pass the workers' URLs there.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from typing import Any, Iterable, Optional

import aiohttp

from slick.engine.http_protocol import generation_from_json, parse_weight_version
from slick.types import Generation, SamplingParams


class EngineError(RuntimeError):
    """An engine could not serve a request (all workers down, or the server refused it)."""


class _Retryable(Exception):
    pass


class HttpEngine:
    """Engine protocol over HTTP (see module docstring).

    ``concurrency`` bounds requests in flight from this client; ``timeout`` is per request (seconds).
    The aiohttp session is created lazily, once per event loop.
    """

    def __init__(self, urls: list[str], *, api_key: Optional[str] = None, concurrency: int = 256,
                 timeout: float = 600.0, max_retries: int = 3, control_urls: Optional[list[str]] = None):
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("HttpEngine needs at least one URL")
        self.urls = [_norm(u) for u in urls]
        self.control_urls = [_norm(u) for u in (control_urls or urls)]
        self.api_key = api_key
        self.concurrency = int(concurrency)
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self._rr = itertools.count()
        self._down: dict[str, float] = {}     # url -> time it last failed
        self._session: Optional[aiohttp.ClientSession] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._version = 0
        self.num_retries = 0                  # requests moved to another worker after a failure

    @property
    def weight_urls(self) -> list[str]:
        """Alias of ``control_urls``: where weight updates and aborts are sent."""
        return self.control_urls

    @weight_urls.setter
    def weight_urls(self, urls: list[str]) -> None:
        self.control_urls = [_norm(u) for u in urls]

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
        try:
            async with session.request(method, url + path, json=payload, timeout=to) as resp:
                text = await resp.text()
                if resp.status >= 500 or resp.status == 429:
                    raise _Retryable(f"{url}{path}: HTTP {resp.status}: {text[:300]}")
                if resp.status >= 400:
                    raise EngineError(f"{url}{path}: HTTP {resp.status}: {_message(text)}")
                if not text.strip():
                    return None
                ctype = resp.headers.get("Content-Type", "")
                if "json" in ctype or text.lstrip()[:1] in "{[":
                    return json.loads(text)
                return text
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as e:
            raise _Retryable(f"{url}{path}: {type(e).__name__}: {e}") from e
        except asyncio.TimeoutError:
            raise EngineError(f"{url}{path}: no answer within {to.total:.0f}s (timeout)") from None

    async def _request(self, method: str, path: str, payload: Any = None) -> Any:
        """Send to one worker, retrying on others after connection errors / 5xx."""
        _, sem = self._ensure()
        errors = []
        order = self._order()
        async with sem:
            for attempt in range(self.max_retries + 1):
                url = order[attempt % len(order)]
                try:
                    out = await self._call(method, url, path, payload)
                    self._down.pop(url, None)
                    return out
                except _Retryable as e:
                    self._down[url] = time.monotonic()
                    self.num_retries += 1
                    errors.append(str(e))
                    if attempt < self.max_retries:
                        await asyncio.sleep(min(0.05 * 2 ** attempt, 1.0))
        raise EngineError(f"no worker could serve {path} after {len(errors)} attempt(s) over "
                          f"{len(self.urls)} worker(s): " + " | ".join(errors[-4:]))

    async def _broadcast(self, method: str, path: str, payload: Any = None) -> list[Any]:
        """Send to every control URL (no fail-over: each one must answer)."""
        self._ensure()

        async def one(url):
            try:
                return await self._call(method, url, path, payload)
            except _Retryable as e:
                raise EngineError(f"worker {url} did not answer {path}: {e}") from None

        return list(await asyncio.gather(*(one(u) for u in self.control_urls)))

    # ------------------------------------------------------------ Engine
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       rid: Optional[str] = None) -> Generation:
        """POST /generate with ``return_logprob`` and ``rid`` (a fresh uuid when None); returns tokens,
        logprobs, finish reason, version, and per-token versions (``output_token_weight_versions`` from
        ``slick serve``; from a server that does not send it, the request's ``weight_version`` per token)."""
        payload = {"input_ids": list(prompt_ids), "sampling_params": sampling.to_sglang(),
                   "return_logprob": True, "stream": False, "rid": uuid.uuid4().hex if rid is None else rid}
        out = await self._request("POST", "/generate", payload)
        if isinstance(out, list):
            out = out[0]
        try:
            gen = generation_from_json(out)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise EngineError(f"could not parse /generate response: {e}") from None
        if not gen.prompt_tokens:
            gen.prompt_tokens = len(prompt_ids)
        self._version = max(self._version, gen.weight_version)
        return gen

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
        for url, o in zip(self.control_urls, outs):
            if not isinstance(o, dict) or not o.get("success", False):
                raise EngineError(f"{url} refused update_weights_from_disk: {o}")
            versions.append(parse_weight_version(o.get("weight_version"), default=-1))
        known = [v for v in versions if v >= 0]
        new = int(version) if version is not None else (max(known) if known else self._version + 1)
        self._version = new
        return new

    async def control(self, url: str, path: str, payload: Any = None, timeout: Optional[float] = None) -> dict:
        """POST ``payload`` to ``path`` on one worker ``url`` (no fail-over) and return its JSON answer, which must
        say ``"success": true``; otherwise ``EngineError`` naming the URL (also for no answer within ``timeout``)."""
        try:
            out = await self._call("POST", _norm(url), path, payload, timeout=timeout)
        except _Retryable as e:
            raise EngineError(f"worker {url} did not answer {path}: {e}") from None
        if not isinstance(out, dict) or not out.get("success", False):
            raise EngineError(f"{url}{path} failed: {out}")
        return out

    async def init_weights_update_group(self, url: str, *, master_address: str, master_port: int,
                                        rank_offset: int, world_size: int, group_name: str = "weight_update_group",
                                        backend: str = "gloo", timeout_s: float = 600.0) -> dict:
        """POST /init_weights_update_group to worker ``url`` (SGLang's fields, plus slick's ``timeout_s``); the
        answer comes once every member has joined. The sender (rank 0) must join meanwhile."""
        return await self.control(url, "/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend,
            "timeout_s": float(timeout_s)}, timeout=timeout_s + 10)

    async def update_weights_from_distributed(self, url: str, names: list, dtypes: list, shapes: list, *,
                                              group_name: str = "weight_update_group",
                                              version: Optional[int] = None, last_bucket: bool = True,
                                              timeout: Optional[float] = None) -> dict:
        """POST /update_weights_from_distributed to worker ``url``: it receives one broadcast per tensor from
        rank 0 while the sender broadcasts; ``last_bucket=False`` stages (slick), the last one applies."""
        payload = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                   "group_name": group_name, "flush_cache": True, "last_bucket": bool(last_bucket)}
        if version is not None:
            payload["weight_version"] = str(int(version))
        out = await self.control(url, "/update_weights_from_distributed", payload, timeout=timeout)
        if last_bucket and version is not None:
            self._version = int(version)
        return out

    async def destroy_weights_update_group(self, url: str, group_name: str = "weight_update_group",
                                           timeout: Optional[float] = 30.0) -> dict:
        """POST /destroy_weights_update_group to worker ``url``."""
        return await self.control(url, "/destroy_weights_update_group", {"group_name": group_name},
                                  timeout=timeout)

    async def abort_all(self) -> None:
        """POST /abort_request (abort all) to every control URL; unreachable workers are skipped."""
        await self._abort({"rid": "", "abort_all": True})

    async def abort(self, rid: str) -> None:
        """POST /abort_request ``{"rid": rid}`` to every control URL (the worker serving it aborts it: it answers
        with its tokens so far and finish reason "abort"; the others do nothing). Unreachable workers are
        skipped; an unknown or finished rid is a no-op."""
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"rid must be a non-empty string, got {rid!r}")
        await self._abort({"rid": rid})

    async def _abort(self, payload: dict) -> None:
        self._ensure()
        results = await asyncio.gather(*(self._call("POST", u, "/abort_request", payload, timeout=30)
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
            except (EngineError, _Retryable, asyncio.TimeoutError):
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


def _norm(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def _message(text: str) -> str:
    try:
        d = json.loads(text)
        if isinstance(d, dict):
            if "error" in d:
                e = d["error"]
                return e.get("message", str(e)) if isinstance(e, dict) else str(e)
            if "message" in d:
                return str(d["message"])
    except ValueError:
        pass
    return text[:300]

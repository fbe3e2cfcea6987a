"""`slick serve`: an HTTP server speaking SGLang's native API in front of a LocalEngine.

    slick serve --hf-checkpoint DIR [--host 127.0.0.1] [--port 30000] [--dtype auto]
                [--api-key KEY] [--max-running 64] [--sglang-KEY VALUE ...]

Endpoints (SGLang names and shapes): POST /generate, GET /health, /health_generate, /get_model_info,
/get_server_info, /get_weight_version, /metrics (Prometheus text); POST /flush_cache, /abort_request,
/update_weights_from_disk, /pause_generation, /continue_generation, and the broadcast group calls
/init_weights_update_group, /update_weights_from_distributed, /destroy_weights_update_group
(``slick/engine/weight_group.py``). Every request first passes the guard of ``slick/serve/http_guard.py``
(Host, Origin, ``--api-key`` on every route but /health, /health_generate and /metrics, JSON-only control
endpoints, ``--max-request-bytes``); bodies are read by ``slick/serve/http_body.py`` and answers never hold
NaN/Infinity. ``/update_weights_from_disk`` loads only the directories of ``slick/serve/weight_dirs.py``.
Bad requests get a 4xx ``{"error": message}``; oversized ``text`` requests are refused before tokenizing,
and tokenizing (and checking a large body) runs off the event loop. A request whose client disconnects is aborted (its slot is freed).
SIGTERM aborts in-flight requests (they answer with finish reason "abort") and exits with code 0.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from aiohttp import web

from slick.engine.limits import limits_of
from slick.engine.weight_group import PATHS as WEIGHT_GROUP_PATHS
from slick.serve.fanout import run_together     # one prompt fails: the others are aborted too
from slick.serve.http_body import THREAD_BYTES, BodyError, dumps, json_response, read_json
from slick.serve.http_guard import HostPolicy, guard_middleware
from slick.serve.routing_wire import routed_fields, wire_meta
from slick.serve.http_protocol import (GenerateItem, RequestError, generation_json, input_logprobs_json,
                                        parse_generate, parse_weight_version, text_char_limit, text_prompts)
from slick.serve.openai_api import OpenAIEndpoint   # OpenAI's /v1/chat/completions, /v1/completions, /v1/models
from slick.serve.weight_dirs import WeightDirPolicy
from slick.serve.weight_group_routes import WeightGroupRoutes
from slick.proc.children import rss_bytes   # the same reading as the training run's /metrics
from slick.types import Generation, SamplingParams

log = logging.getLogger("slick.serve")

PROTECTED = {"/update_weights_from_disk", "/abort_request", "/pause_generation", "/continue_generation",
             "/flush_cache", *WEIGHT_GROUP_PATHS}
OPEN = ("/health", "/health_generate", "/metrics")     # no API key needed, as in SGLang
MIN_BODY_BYTES = 4 << 20    # --max-request-bytes default: max(4 MiB, 256 bytes per context token)
STREAM_EVERY_S = 0.05       # a streamed /generate sends the tokens so far this often


class SlickServer:
    """Routes SGLang-native HTTP requests to an engine (LocalEngine or anything with its API).

    ``engine`` needs ``generate(ids, sampling, rid=)``, ``update_weights``, ``abort``, ``abort_all``,
    ``pause_generation``, ``continue_generation``, ``get_weight_version``, ``close``, ``tokenizer``,
    ``vocab_size``, ``max_context``, ``stats()`` and ``progress()`` (``eos_ids`` is used when present).
    A ``text`` longer than ``max_text_chars`` characters is refused before tokenizing; by default that is the
    longest vocabulary entry (in characters) times ``max_context - 1``, which no prompt that fits can exceed.
    ``host`` (the bound address) and ``allowed_hosts`` set the Host/Origin check, ``max_request_bytes`` the body
    limit (default: max(4 MiB, 256 x context)), ``allowed_weight_dirs`` where weights may be loaded from.
    """

    def __init__(self, engine: Any, *, model_path: str, api_key: Optional[str] = None,
                 server_args: Optional[dict] = None, max_batch: int = 4096,
                 max_text_chars: Optional[int] = None, host: str = "127.0.0.1", allowed_hosts=(),
                 max_request_bytes: Optional[int] = None, allowed_weight_dirs=()):
        self.engine = engine
        self.model_path = model_path
        self.api_key = api_key
        self.hosts = HostPolicy(host, allowed_hosts)
        self.max_request_bytes = int(max_request_bytes or max(MIN_BODY_BYTES, 256 * engine.max_context))
        self.weight_dirs = WeightDirPolicy(model_path, allowed_weight_dirs)
        self.server_args = dict(server_args or {})
        self.max_batch = max_batch
        self.max_text_chars = max_text_chars if max_text_chars is not None else _max_text_chars(engine)
        self.eos_ids = set(getattr(engine, "eos_ids", ()))
        self.started = time.time()
        self.shutting_down = False
        self.paused = False
        self._tasks: dict[str, asyncio.Task] = {}      # rid -> task running engine.generate
        self._weights_lock = asyncio.Lock()
        self.counters = {"requests_total": 0, "request_errors_total": 0, "aborted_requests_total": 0,
                         "prompt_tokens_total": 0, "http_generation_tokens_total": 0,
                         "disconnect_aborted_requests_total": 0, "client_disconnects_total": 0}

    # ------------------------------------------------------------------ app
    def app(self) -> web.Application:
        """The aiohttp application with every route and the error/auth middleware.

        Run it with ``handler_cancellation=True`` (as :func:`serve` does) so that a client that disconnects
        cancels its handler, which aborts its generation."""
        guard = guard_middleware(self.hosts, api_key=self.api_key, open_paths=OPEN, control_paths=PROTECTED,
                                 max_body_bytes=self.max_request_bytes, on_refuse=self._count_error)
        app = web.Application(client_max_size=self.max_request_bytes, middlewares=[guard, self._middleware])
        r = app.router
        r.add_post("/generate", self.generate)
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_weight_version", self.weight_version)
        r.add_get("/metrics", self.metrics)
        for path, h in [("/flush_cache", self.flush_cache), ("/abort_request", self.abort_request),
                        ("/update_weights_from_disk", self.update_weights_from_disk),
                        ("/pause_generation", self.pause), ("/continue_generation", self.resume)]:
            r.add_post(path, h)
        r.add_get("/flush_cache", self.flush_cache)

        OpenAIEndpoint(self.engine, self.engine.tokenizer, model_name=self.model_path,
                       max_context=self.engine.max_context, vocab_size=self.engine.vocab_size,
                       eos_ids=self.eos_ids, max_text_chars=self.max_text_chars,
                       on_disconnect=self._count_disconnects, on_generated=self._count_generated).add_routes(app)
        self.weight_groups = WeightGroupRoutes(self)    # broadcast updates: slick/serve/weight_group_routes.py
        self.weight_groups.register(r)
        return app

    def _count_error(self) -> None:
        self.counters["request_errors_total"] += 1

    def _count_disconnects(self, n: int) -> None:
        self.counters["disconnect_aborted_requests_total"] += n

    def _count_generated(self, prompt_tokens: int, generated_tokens: int) -> None:
        self.counters["prompt_tokens_total"] += prompt_tokens
        self.counters["http_generation_tokens_total"] += generated_tokens

    @web.middleware
    async def _middleware(self, request: web.Request, handler):
        v1 = request.method == "POST" and request.path.startswith("/v1/")   # OpenAI/Anthropic: counted here,
        if v1:                                                                # they answer their own errors
            self.counters["requests_total"] += 1
        try:
            resp = await handler(request)
            if v1:
                self.counters["request_errors_total"] += resp.status >= 400
            return resp
        except (asyncio.CancelledError, ConnectionError):   # the client went away (its handler was cancelled, or
            self.counters["client_disconnects_total"] += 1   # a write to it failed)
            raise
        except (RequestError, BodyError) as e:
            self.counters["request_errors_total"] += 1
            return _error(str(e), e.status)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            self.counters["request_errors_total"] += 1
            return _error(e.reason if e.text is None else f"{e.reason}: {e.text}", e.status)
        except ValueError as e:          # the engine refused the input
            self.counters["request_errors_total"] += 1
            return _error(f"{type(e).__name__}: {e}", 400)
        except Exception as e:  # noqa: BLE001 - answer JSON, keep serving
            self.counters["request_errors_total"] += 1
            log.exception("%s %s failed", request.method, request.path)
            return _error(f"internal error: {type(e).__name__}: {e}", 500)

    async def _json(self, request: web.Request, default: Any = None) -> Any:
        return await read_json(request, default)

    # ------------------------------------------------------------ generate
    async def generate(self, request: web.Request) -> web.StreamResponse:
        """POST /generate: single or batched prompts; see ``http_protocol`` for shapes."""
        if self.shutting_down:
            return _error("server is shutting down", 503)
        body = await self._json(request)
        tok = self.engine.tokenizer
        texts = text_prompts(body, max_batch=self.max_batch, max_chars=self.max_text_chars)   # sizes first
        text_ids = None
        if texts is not None:   # the tokenizer releases the GIL: /health keeps answering meanwhile
            text_ids = await asyncio.to_thread(
                lambda: tok(texts, add_special_tokens=False)["input_ids"])
        parse = lambda: parse_generate(   # noqa: E731 - a large body is checked off the event loop
            body, vocab_size=self.engine.vocab_size, max_context=self.engine.max_context, text_ids=text_ids,
            max_batch=self.max_batch, max_text_chars=self.max_text_chars)
        req = await asyncio.to_thread(parse) if len(await request.read()) > THREAD_BYTES else parse()
        limits = limits_of(self.engine)     # stop strings, grammar size and depth: 400 naming the flag
        for i, it in enumerate(req.items):
            limits.check_sampling(it.sampling, f"sampling_params[{i}]" if req.batched else "sampling_params")
        routed, routed_start = self._routed_fields(body, req)
        rids = [it.rid for it in req.items]
        dup = sorted({r for r in rids if rids.count(r) > 1 or r in self._tasks})
        if dup:
            raise RequestError(f"rid {dup[0]!r} is already in flight (rids must be unique)")
        self.counters["requests_total"] += 1
        t0 = time.perf_counter()
        inputs = await self._input_logprobs(req)   # logprob_start_len >= 0: the prompts' logprobs
        if req.stream and not req.batched and hasattr(self.engine, "partial"):
            return await self._stream_one(request, req.items[0], req.return_logprob, t0,
                                          routed_start if routed else None)
        gens = await run_together([self._run_one(it) for it in req.items],
                                  stop=lambda i: self.engine.abort(req.items[i].rid))
        dt = time.perf_counter() - t0
        out = []
        for gen, it in zip(gens, req.items):
            text = self._text(gen, it.sampling)
            out.append(generation_json(gen, it, text=text, return_logprob=req.return_logprob, e2e_latency=dt))
            out[-1]["meta_info"].update(inputs.pop(0) if inputs else {})
            if routed:
                out[-1]["meta_info"].update(wire_meta(gen.routed_experts, routed_start))
            self.counters["prompt_tokens_total"] += len(it.prompt_ids)
            self.counters["http_generation_tokens_total"] += len(gen.token_ids)
        result = out if req.batched else out[0]
        if not req.stream:
            return json_response(result)
        # Streaming: this engine yields whole generations, so the stream carries one final chunk.
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for o in out:
            await resp.write(f"data: {dumps(o)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _routed_fields(self, body: dict, req) -> tuple[bool, int]:
        """``return_routed_experts`` and ``routed_experts_start_len`` (slick/serve/routing_wire.py), checked; a
        dense model has no experts to return (400 naming the field)."""
        routed, start = routed_fields(body, [len(it.prompt_ids) for it in req.items])
        if routed and getattr(getattr(getattr(self.engine, "model", None), "cfg", None), "moe", None) is None:
            raise RequestError(f"return_routed_experts: {self.model_path} has no experts (a dense model routes "
                               "nothing); only mixture-of-experts models return routed experts")
        return routed, start

    async def _input_logprobs(self, req) -> list[dict]:
        """SGLang's ``input_token_logprobs`` (and ``input_top_logprobs``) of every prompt of ``req`` from
        ``logprob_start_len`` on (the engine's ``prompt_logprobs``, one forward each), or [] when not asked."""
        if req.logprob_start_len < 0:
            return []
        if req.stream:
            raise RequestError("logprob_start_len with stream: slick serve returns prompt logprobs only in an "
                               "answer that is not streamed")
        if not hasattr(self.engine, "prompt_logprobs"):
            raise RequestError("this engine returns no prompt logprobs (logprob_start_len)")
        out = []
        for it in req.items:
            token_lps, top = await self.engine.prompt_logprobs(it.prompt_ids, req.top_logprobs_num)
            out.append(input_logprobs_json(it.prompt_ids, token_lps, top, req.logprob_start_len))
        return out

    async def _stream_one(self, request: web.Request, item: GenerateItem, return_logprob: bool,
                          t0: float, routed_start: Optional[int] = None) -> web.StreamResponse:
        """A streamed /generate of one prompt: every ``STREAM_EVERY_S`` seconds a chunk with the tokens generated
        since the previous one (``finish_reason`` null, ``meta_info.output_offset`` = tokens sent before, ``text``
        empty), then the final chunk (the whole generation, as without streaming) and ``[DONE]``. A client that
        keeps the chunks knows every token it was sent if the server dies (slick's fault tolerance). With
        ``routed_start`` (``return_routed_experts``) the final chunk carries the routed experts from there on."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        task = asyncio.ensure_future(self._run_one(item))
        sent = 0
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=STREAM_EVERY_S)
                part = None if task.done() else self.engine.partial(item.rid, sent)
                if part is not None and part[0]:
                    ids, lps, versions = part
                    gen = Generation(ids, lps, "abort", versions[-1], len(item.prompt_ids), weight_versions=versions)
                    chunk = generation_json(gen, item, text="", return_logprob=return_logprob,
                                            e2e_latency=time.perf_counter() - t0)
                    chunk["meta_info"].update(finish_reason=None, output_offset=sent)
                    await resp.write(f"data: {dumps(chunk)}\n\n".encode())
                    sent += len(ids)
        except BaseException:
            task.cancel()
            raise
        gen = task.result()
        out = generation_json(gen, item, text=self._text(gen, item.sampling), return_logprob=return_logprob,
                              e2e_latency=time.perf_counter() - t0)
        if routed_start is not None:
            out["meta_info"].update(wire_meta(gen.routed_experts, routed_start))
        self.counters["prompt_tokens_total"] += len(item.prompt_ids)
        self.counters["http_generation_tokens_total"] += len(gen.token_ids)
        await resp.write(f"data: {dumps(out)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    async def _run_one(self, item: GenerateItem) -> Generation:
        if item.sampling.max_new_tokens == 0:
            return Generation([], [], "length", await self.engine.get_weight_version(), len(item.prompt_ids),
                              weight_versions=[])
        task = asyncio.ensure_future(self.engine.generate(item.prompt_ids, item.sampling, rid=item.rid))
        self._tasks[item.rid] = task
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:   # the handler was cancelled: the client went away
            if not task.done():
                task.cancel()            # the engine drops the request and frees its slot
                self.counters["disconnect_aborted_requests_total"] += 1
            raise
        finally:
            if self._tasks.get(item.rid) is task:
                del self._tasks[item.rid]
        if task.cancelled():   # cancelled at shutdown: no partial output survives a cancel
            self.counters["aborted_requests_total"] += 1
            return Generation([], [], "abort", await self.engine.get_weight_version(), len(item.prompt_ids),
                              weight_versions=[])
        gen = task.result()
        if gen.finish_reason == "abort":
            self.counters["aborted_requests_total"] += 1
        return gen

    def _text(self, gen: Generation, sp: SamplingParams) -> str:
        """The response text, as SGLang's detokenizer makes it: special tokens skipped unless
        ``skip_special_tokens`` is false, and (unless ``no_stop_trim``) the matched stop token or stop string cut off."""
        ids = gen.token_ids
        trim = gen.finish_reason == "stop" and not sp.no_stop_trim
        stop_ids = set() if sp.ignore_eos else self.eos_ids | set(sp.stop_token_ids or ())
        if trim and ids and ids[-1] in stop_ids:
            ids = ids[:-1]
        text = self.engine.tokenizer.decode(ids, skip_special_tokens=sp.skip_special_tokens)
        if trim and sp.stop:
            cut = [i for i in (text.find(s) for s in sp.stop if s) if i >= 0]
            if cut:
                text = text[:min(cut)]
        return text

    # --------------------------------------------------------------- info
    async def health(self, request: web.Request) -> web.Response:
        """GET /health: 200 while serving, 503 while shutting down."""
        if self.shutting_down:
            return _error("server is shutting down", 503)
        return web.Response(text="")

    async def health_generate(self, request: web.Request) -> web.Response:
        """GET /health_generate: runs a one-token greedy generation (while paused, the answer itself shows the
        server is alive: no generation can run until /continue_generation)."""
        if self.shutting_down:
            return _error("server is shutting down", 503)
        if self.paused:
            return web.Response(text="")
        gen = await self.engine.generate([0], SamplingParams(temperature=0.0, max_new_tokens=1))
        if gen.finish_reason == "abort" or len(gen.token_ids) != 1:
            return _error(f"health generation failed (finish {gen.finish_reason})", 503)
        return web.Response(text="")

    async def model_info(self, request: web.Request) -> web.Response:
        """GET /get_model_info."""
        return json_response({
            "model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
            "vocab_size": self.engine.vocab_size, "max_context_length": self.engine.max_context,
            "weight_version": await self.engine.get_weight_version(), "engine": "slick"})

    async def server_info(self, request: web.Request) -> web.Response:
        """GET /get_server_info: launch arguments plus live state."""
        info = dict(self.server_args)
        info.update({"model_path": self.model_path, "context_length": self.engine.max_context,
                     "weight_version": await self.engine.get_weight_version(),
                     "paused": self.paused, "inflight_tokens": self.engine.progress(),
                     "uptime_s": round(time.time() - self.started, 3),
                     "internal_states": [self.engine.stats()], "version": _version()})
        return json_response(info)

    async def weight_version(self, request: web.Request) -> web.Response:
        """GET /get_weight_version."""
        return json_response({"weight_version": await self.engine.get_weight_version()})

    async def metrics(self, request: web.Request) -> web.Response:
        """GET /metrics: Prometheus text exposition format."""
        st = self.engine.stats()
        rows = [
            ("slick_num_running_reqs", "gauge", "Requests being decoded.", st.get("running", 0)),
            ("slick_num_queue_reqs", "gauge", "Requests waiting for a slot.", st.get("queued", 0)),
            ("slick_generation_tokens_total", "counter", "Tokens generated by the engine.",
             st.get("generated_tokens_total", 0)),
            ("slick_gen_throughput", "gauge", "Recent generation throughput (tokens/s).",
             st.get("tokens_per_sec", 0.0)),
            ("slick_prefill_tokens_total", "counter", "Prompt tokens computed by prefills.",
             st.get("prefill_tokens", 0)),
            ("slick_prefix_reused_tokens_total", "counter",
             "Prompt tokens not recomputed because prompts admitted together shared them.",
             st.get("prefix_reused_tokens", 0)),
            ("slick_prompt_reused_tokens_total", "counter",
             "Prompt tokens copied from a running request with the same prompt instead of a prefill.",
             st.get("prompt_reused_tokens", 0)),
            ("slick_http_inflight_requests", "gauge", "Prompts currently in /generate.", len(self._tasks)),
            ("slick_weight_version", "gauge", "Version of the loaded weights.",
             await self.engine.get_weight_version()),
            ("slick_paused", "gauge", "1 while generation is paused.", int(self.paused)),
            ("slick_process_rss_bytes", "gauge", "Resident memory of this server process.", rss_bytes()),
        ]
        counters = dict(self.counters)
        if "aborted" in st:   # the engine counts every request it ended early: aborts, disconnects, shutdown
            counters["aborted_requests_total"] = st["aborted"]
        rows += [(f"slick_{k}", "counter", f"Server counter {k}.", v) for k, v in counters.items()]
        lines = []
        for name, kind, help_, value in rows:
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {float(value):g}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    # ------------------------------------------------------------ control
    async def flush_cache(self, request: web.Request) -> web.Response:
        """POST /flush_cache: the engine keeps no cache across requests, so this only acknowledges."""
        return json_response({"success": True, "message": "Cache flushed."})

    async def abort_request(self, request: web.Request) -> web.Response:
        """POST /abort_request: ``{}`` or ``{"abort_all": true}`` aborts all, ``{"rid": ID}`` one request, which
        answers with its tokens so far and finish reason "abort" (an unknown rid: ``success`` false)."""
        body = await self._json(request, default={})
        if not isinstance(body, dict):
            raise RequestError("abort_request body must be a JSON object")
        rid = body.get("rid") or ""
        if not isinstance(rid, str):
            raise RequestError("rid must be a string")
        if rid and not body.get("abort_all"):
            if rid not in self.engine.progress():
                return json_response({"success": False, "message": f"no running request with rid {rid!r}"})
            await self.engine.abort(rid)
            return json_response({"success": True, "message": f"aborted {rid}", "aborted": 1})
        n = await self.abort_everything()
        return json_response({"success": True, "message": "aborted all requests", "aborted": n})

    async def abort_everything(self) -> int:
        """Abort every running request; each answers with finish reason "abort"."""
        n = len(self._tasks)
        await self.engine.abort_all()
        return n

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """POST /update_weights_from_disk ``{"model_path": DIR, "weight_version"?}``."""
        body = await self._json(request)
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str) or not body["model_path"]:
            raise RequestError("update_weights_from_disk needs {'model_path': DIR}")
        refused = self.weight_dirs.check(body["model_path"])
        if refused:
            raise RequestError(refused, status=403)
        version = body.get("weight_version")
        if version is not None:
            v = parse_weight_version(version, default=-1)
            if v < 0:
                raise RequestError(f"weight_version must be a non-negative integer, got {version!r}")
            version = v
        t0 = time.perf_counter()
        async with self._weights_lock:
            try:   # shielded: a client that disconnects does not interrupt a copy half-way
                new = await asyncio.shield(self.engine.update_weights(path=body["model_path"], version=version))
            except (FileNotFoundError, ValueError, KeyError, RuntimeError, OSError) as e:
                return json_response({"success": False, "message": f"{type(e).__name__}: {e}"}, status=400)
        paused = len(self.engine.progress()) if self.paused else 0
        return json_response({"success": True, "message": f"loaded weights from {body['model_path']}",
                                  "weight_version": new, "num_paused_requests": paused,
                                  "load_time_s": round(time.perf_counter() - t0, 4)})

    async def pause(self, request: web.Request) -> web.Response:
        """POST /pause_generation ``{"mode": "abort"|"in_place"|"retract"}``: no decode step runs until
        /continue_generation; new requests are accepted and wait.

        mode "abort" (default, as in SGLang) also aborts every request in flight (partial output kept).
        "in_place" keeps them, KV cache included; they go on after continue under the weights loaded then.
        "retract" behaves as "in_place" here (nothing is evicted: the cache is preallocated).
        The answer lists ``{rid: tokens so far}`` of the requests left paused (``paused_requests``).
        """
        body = await self._json(request, default={})
        mode = body.get("mode", "abort") if isinstance(body, dict) else "abort"
        if mode not in ("abort", "in_place", "retract"):
            raise RequestError(f"unknown pause mode {mode!r} (abort, in_place, retract)")
        await self.engine.pause_generation()
        self.paused = True
        n = await self.abort_everything() if mode == "abort" else 0
        return json_response({"success": True, "message": f"paused ({mode})", "aborted": n,
                                  "paused_requests": self.engine.progress()})

    async def resume(self, request: web.Request) -> web.Response:
        """POST /continue_generation: paused and waiting requests go on (a no-op when not paused)."""
        self.paused = False
        await self.engine.continue_generation()
        return json_response({"success": True, "message": "generation continues"})

    # ----------------------------------------------------------- shutdown
    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Refuse new work, abort in-flight requests and wait (bounded) for their answers."""
        self.shutting_down = True
        self.paused = False
        await self.engine.continue_generation()
        await self.engine.abort_all()
        deadline = time.monotonic() + grace_s
        while self._tasks and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for t in list(self._tasks.values()):
            t.cancel()


def _max_text_chars(engine: Any) -> int:
    return text_char_limit(engine.tokenizer, engine.max_context)


def _error(message: str, status: int) -> web.Response:
    return json_response({"error": message}, status=status)


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("slick")
    except Exception:  # noqa: BLE001 - running from a source tree
        return "0+unknown"

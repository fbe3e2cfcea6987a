"""OpenAI-compatible endpoints over any slick engine: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

``slick serve`` registers them beside SGLang's native API, and the black-box agent rollout
(``slick/rollout/agent.py``) serves them per session for the in-process engine or in front of HTTP engines.
Requests and answers follow OpenAI's shapes (what the ``openai`` client library sends and reads):

- chat: ``messages`` (string content or a list of text parts), ``tools`` (function tools) with ``tool_choice``
  ``"auto"`` (default), ``"none"``, ``"required"`` or a named function (forced by grammar), ``response_format``
  (``json_object`` / ``json_schema``, by grammar: ``openai_constraints``), ``n``, ``stop``, ``max_tokens`` /
  ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``logprobs`` with ``top_logprobs`` (0..20);
- completions: ``prompt`` (a string, a list of token ids, or a list of either), ``n``, ``stop``, ``max_tokens``,
  ``temperature``, ``top_p``, ``seed``, ``logprobs`` (0..5 alternatives), ``echo`` false, no ``suffix``;
- both: ``stream`` with ``stream_options.include_usage`` (server-sent events: ``openai_stream``).

Extensions (vLLM's names): ``top_k``, ``ignore_eos``, and ``return_token_ids: true``, which adds the top-level
``prompt_token_ids`` and per choice ``token_ids`` (every sampled token, the stop token included) and
``weight_versions`` (the weight version that sampled each of them).

Tools: the prompt is the tokenizer's chat template with ``tools=`` when the template renders tools; for a
template that does not (SmolLM2's) the schemas go into the system message in the format of
:mod:`slick.chat.toolcall`. Assistant messages that carry ``tool_calls`` are rendered the same way (Hermes
``<tool_call>{json}</tool_call>`` text for templates without tool support). The answer's text is parsed with
the Hermes parser: calls become ``message.tool_calls`` (``arguments`` a JSON string, as OpenAI sends it), the
text outside them ``message.content`` (null when empty), and ``finish_reason`` is ``"tool_calls"``.

With ``seed`` and ``n > 1``, choice ``i`` is sampled with seed ``seed + i`` (reproducible, yet different).
Without ``max_tokens`` a completion may fill the context. Every field is honoured or refused: fields OpenAI defines
that change sampling in ways slick cannot follow (``presence_penalty`` other than 0, ``logit_bias``, ...) and
unknown fields answer 400 naming the field. ``/v1/responses`` and Anthropic's ``/v1/messages`` translate to the
chat path (``responses_api``, ``messages_api``). Errors use
OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``. Any ``model`` name is accepted.

Bodies are read by ``slick/serve/http_body.py`` (strict JSON, lone surrogates refused naming the field, large
bodies checked in a thread); sizes are checked before any per-message work (``check_sizes``: 413 for text of more
than ``max_text_chars`` characters or an id prompt that cannot fit the context); answers never hold NaN/Infinity.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any, Callable, Optional

from aiohttp import web

from slick.chat.toolcall import get_parser
from slick.engine.limits import LimitError, limits_of    # n, stop strings, grammar size/depth per request
from slick.serve.fanout import generate_all     # all checked before any starts; one fails: all stop
from slick.serve.http_body import THREAD_BYTES, BodyError, json_response, read_json
from slick.serve.http_protocol import text_char_limit
from slick.serve.openai_constraints import constraint     # tool_choice / response_format -> engine grammar
from slick.serve.openai_protocol import (Call, Choice, OpenAIError, Params, check_sizes, completion_logprobs,
                                          finish_reason, parse_messages, parse_params, parse_prompts, parse_tools,
                                          render_chat, response_text, split_tool_calls, token_logprobs, usage)
from slick.serve.openai_stream import Streamer, head as stream_head, run_polled   # "stream": true
from slick.serve.messages_api import MessagesAPI       # Anthropic's /v1/messages
from slick.serve.responses_api import ResponsesAPI     # OpenAI's /v1/responses
from slick.types import Generation, SamplingParams

__all__ = ["OpenAIEndpoint", "OpenAIError", "error_response", "Call", "Choice"]
log = logging.getLogger("slick.openai")


def error_response(message: str, status: int = 400, param: Optional[str] = None,
                   type: str = "invalid_request_error") -> web.Response:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return web.json_response({"error": {"message": message, "type": type, "param": param, "code": None}},
                             status=status)


class OpenAIEndpoint:
    """The OpenAI routes for ``engine`` (anything with ``generate(ids, sampling)``).

    ``engine`` may be a zero-argument callable returning the engine (the agent rollout's engine can be swapped).
    ``sessions``: an object with ``get(sid)`` returning a session (or None) that has ``sampling(params,
    max_new_tokens, index) -> SamplingParams``, ``max_new_tokens(requested, prompt_len) -> int``,
    ``chat_prompt(messages, tools) -> (ids, text, parent)``, and ``record(call)``; routes under
    ``/sessions/{sid}/v1/...`` then record every call (see ``slick/rollout/agent.py``).
    """

    def __init__(self, engine: Any, tokenizer, *, model_name: str, max_context: Optional[int] = None,
                 vocab_size: Optional[int] = None, eos_ids=(), sessions: Any = None, tool_parser: str = "hermes",
                 max_text_chars: Optional[int] = None, on_disconnect: Optional[Callable[[int], None]] = None,
                 on_generated: Optional[Callable[[int, int], None]] = None):
        self._engine = engine
        self.on_disconnect = on_disconnect      # hears how many choices a client that went away left unfinished
        self.on_generated = on_generated        # hears (prompt tokens, tokens generated for its choices) per prompt
        self.tok = tokenizer
        self.model_name = model_name
        self.max_context = max_context
        self.vocab_size = vocab_size
        self.eos_ids = set(eos_ids)
        self.sessions = sessions
        self.parser = get_parser(tool_parser)
        self.tool_parser = tool_parser
        self.created = int(time.time())
        if max_text_chars is None and max_context is not None and hasattr(tokenizer, "get_vocab"):
            max_text_chars = text_char_limit(tokenizer, max_context)
        self.max_text_chars = max_text_chars

    @property
    def engine(self):
        return self._engine() if callable(self._engine) and not hasattr(self._engine, "generate") else self._engine

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/chat/completions", self.chat)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/v1/models", self.models)
        extra = [ResponsesAPI(self), MessagesAPI(self)]      # /v1/responses, /v1/messages over the chat path
        for x in extra:
            x.add_routes(r, "")
        if self.sessions is not None:
            r.add_post("/sessions/{sid}/v1/chat/completions", self.chat)
            r.add_post("/sessions/{sid}/v1/completions", self.completions)
            r.add_get("/sessions/{sid}/v1/models", self.models)
            for x in extra:
                x.add_routes(r, "/sessions/{sid}")

    # ------------------------------------------------------------------ handlers
    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models: the one model served."""
        return json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "slick",
             "max_model_len": self.max_context}]})

    async def chat(self, request: web.Request) -> web.Response:
        """POST /v1/chat/completions."""
        return await self._answer(request, self._chat)

    async def completions(self, request: web.Request) -> web.Response:
        """POST /v1/completions."""
        return await self._answer(request, self._completions)

    async def _answer(self, request: web.Request, handler) -> web.StreamResponse:
        """``handler(request)``'s answer (a dict, or a stream it wrote), or the error in OpenAI's shape."""
        try:
            out = await handler(request)
            return out if isinstance(out, web.StreamResponse) else json_response(out)
        except OpenAIError as e:
            return error_response(str(e), e.status, e.param, e.type)
        except BodyError as e:
            return error_response(str(e), e.status, e.param)
        except ValueError as e:          # the engine refused the input
            return error_response(f"{type(e).__name__}: {e}", 400)
        except ConnectionError:          # the client went away: nobody to answer (the server counts it)
            raise
        except Exception as e:  # noqa: BLE001 - answer in OpenAI's shape, keep serving
            log.exception("POST %s failed", request.path)
            return error_response(f"internal error: {type(e).__name__}: {e}", 500, type="server_error")

    # ------------------------------------------------------------------ internals
    async def _parse(self, request: web.Request, parse) -> Any:
        """``parse(body)`` (which checks sizes first), in a worker thread when the body is large (``/health``
        keeps answering)."""
        body = await read_json(request)
        big = len(await request.read()) > THREAD_BYTES
        return await asyncio.to_thread(parse, body) if big else parse(body)

    def _chat_request(self, body: Any):
        check_sizes(body, True, self.max_context, self.max_text_chars)
        params = self._within_limits(parse_params(body, chat=True))
        messages, (tools, parse_calls) = parse_messages(body), parse_tools(body)
        params.grammar = constraint(body, tools, self.tool_parser)
        self._within_limits(params)
        return params, messages, (tools, parse_calls)

    def _completion_request(self, body: Any):
        check_sizes(body, False, self.max_context, self.max_text_chars)
        return self._within_limits(parse_params(body, chat=False)), parse_prompts(body, self.vocab_size)[0]

    def _within_limits(self, params: Params) -> Params:
        """``params``, or an OpenAIError naming the field and the engine's limit (``slick/engine/limits.py``):
        ``n``, stop strings, and the grammar of ``response_format`` / ``tool_choice``."""
        lim = limits_of(self.engine)
        try:
            lim.check_n(params.n)
            lim.check_sampling(params.sampling(1), "")
        except LimitError as e:
            param = {"json_schema": "response_format", "ebnf": "tool_choice"}.get(e.field, e.field)
            raise OpenAIError(str(e), 400, param=param) from None
        return params

    def _session(self, request: web.Request):
        sid = request.match_info.get("sid")
        if sid is None:
            return None
        s = self.sessions.get(sid)
        if s is None:
            raise OpenAIError(f"no open agent session {sid!r} (it finished, or never existed)", 404,
                              type="not_found_error")
        return s

    def _max_new(self, params: Params, prompt_len: int, session) -> int:
        ctx = self.max_context
        if ctx is not None and prompt_len >= ctx:
            raise OpenAIError(f"the prompt has {prompt_len} tokens; the context is {ctx}", 400, param="messages")
        room = None if ctx is None else ctx - prompt_len
        want = params.max_tokens
        if want is not None and room is not None and want > room:
            raise OpenAIError(f"prompt {prompt_len} + max_tokens {want} exceeds the context of {ctx} tokens",
                              param="max_tokens")
        if session is not None:
            return session.max_new_tokens(want, room)
        if want is None:
            if room is None:
                raise OpenAIError("'max_tokens' is required by this endpoint (its context length is unknown)",
                                  param="max_tokens")
            return room
        return want

    def _samplings(self, params: Params, max_new: int, session) -> list[SamplingParams]:
        """One SamplingParams per choice (a session sets its own sampling; the grammar and top logprobs are the
        request's either way)."""
        if session is None:
            return [params.sampling(max_new, i) for i in range(params.n)]
        return [dataclasses.replace(session.sampling(params, max_new, i), **params.engine_fields())
                for i in range(params.n)]

    async def _generate(self, ids: list[int], sps: list[SamplingParams], progress=None) -> list[Generation]:
        """The choices of one prompt (streamed to ``progress`` when given), counted for ``on_generated``."""
        jobs = [(ids, sp) for sp in sps]
        gens = await (generate_all(self.engine, jobs, on_cancel=self.on_disconnect) if progress is None else
                      run_polled(self.engine, jobs, progress, on_disconnect=self.on_disconnect))
        if self.on_generated is not None:
            self.on_generated(len(ids), sum(len(g.token_ids) for g in gens))
        return gens

    def _id_fields(self, params: Params) -> dict:
        return {"created": int(time.time()), "model": params.model or self.model_name}

    async def chat_answer(self, request: web.Request, body: dict) -> dict:
        """The unstreamed ``/v1/chat/completions`` answer to ``body`` (the Responses and Messages APIs translate
        to and from it; ``request`` carries the agent session id, if any). Raises OpenAIError."""
        return await self._chat(request, {**body, "stream": False})

    async def chat_stream(self, request: web.Request, body: dict, writer) -> web.StreamResponse:
        """Stream the chat answer to ``body`` token by token into ``writer(prompt_tokens)``, a
        ``slick.serve.sse.ChunkEvents`` (the Responses and Messages APIs' events); it gets the usage last.
        Raises OpenAIError before the stream opens."""
        return await self._chat(request, {**body, "stream": True, "stream_options": {"include_usage": True}}, writer)

    async def _chat(self, request: web.Request, body: Optional[dict] = None, writer=None):
        if body is None:
            params, messages, (tools, parse_calls) = await self._parse(request, self._chat_request)
        else:
            params, messages, (tools, parse_calls) = self._chat_request(body)
        session = self._session(request)
        if session is not None:
            ids, text, parent = await asyncio.to_thread(session.chat_prompt, messages, tools)
        else:
            (ids, text), parent = await asyncio.to_thread(render_chat, self.tok, messages, tools), None
        sps = self._samplings(params, self._max_new(params, len(ids), session), session)

        def result(gens: list[Generation]) -> tuple[dict, list[int]]:
            return self._chat_result(params, ids, sps, gens, parse_calls, session,
                                     Call("chat", list(ids), [], messages=messages, tools=tools, prompt_text=text,
                                          parent=parent))

        if params.stream:
            st = Streamer(request, "chat", stream_head("chat", params.model or self.model_name), self.tok, params,
                          params.stop, parse_calls, params.n, sse=None if writer is None else writer(len(ids)))
            return await self._stream(st, ids, sps, result)
        return result(await self._generate(ids, sps))[0]

    def _chat_result(self, params: Params, ids: list[int], sps: list, gens: list, parse_calls: bool, session,
                     call: Call) -> tuple[dict, list[int]]:
        """The unstreamed answer of a chat call (a stream ends with the same), recorded in ``session``, and per
        choice the number of leading tokens its text covers."""
        choices, n_texts = [], []
        for i, (gen, sp) in enumerate(zip(gens, sps)):
            content, n_text = response_text(self.tok, gen, sp, self.eos_ids)
            calls = []
            if parse_calls:
                content, calls = split_tool_calls(content, self.parser, gen.finish_reason == "length")
            msg = {"role": "assistant", "content": content}
            if calls:
                msg["tool_calls"] = calls
            ch = {"index": i, "message": msg, "finish_reason": finish_reason(gen, bool(calls)), "logprobs": None}
            n_texts.append(n_text)
            if params.logprobs:
                ch["logprobs"] = {"content": token_logprobs(self.tok, gen.token_ids[:n_text], gen.logprobs[:n_text],
                                                            _tops(gen, params, n_text, self.engine)), "refusal": None}
            if params.return_token_ids:
                ch["token_ids"] = list(gen.token_ids)
                ch["weight_versions"] = _versions(gen)
            choices.append(ch)
            call.choices.append(Choice(list(gen.token_ids), list(gen.logprobs), _versions(gen), gen.finish_reason,
                                       message=msg, text=content or ""))
        if session is not None:
            session.record(call)
        out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", **self._id_fields(params),
               "choices": choices, "usage": usage(len(ids), gens), "system_fingerprint": None}
        if params.return_token_ids:
            out["prompt_token_ids"] = list(ids)
        return out, n_texts

    async def _stream(self, st: Streamer, ids: list[int], sps: list, result) -> web.StreamResponse:
        """Stream one prompt's choices (module doc of ``openai_stream``); ``result(gens)`` is the final answer."""
        await st.start()
        try:
            gens = await self._generate(ids, sps, st.progress)
            out, n_texts = result(gens)
        except (OpenAIError, ValueError) as e:
            return await st.error(str(e), "invalid_request_error")
        except (ConnectionError, asyncio.CancelledError):
            raise                              # the client went away: run_polled aborted its requests
        except Exception as e:  # noqa: BLE001 - the stream is open: say so in it
            log.exception("streamed %s failed", st.kind)
            return await st.error(f"internal error: {type(e).__name__}: {e}")
        for i, (gen, ch) in enumerate(zip(gens, out["choices"])):
            await st.finish(i, gen, ch, n_texts[i])
        return await st.end(out["usage"])

    async def _completions(self, request: web.Request):
        params, prompts = await self._parse(request, self._completion_request)
        session = self._session(request)
        if session is not None and len(prompts) > 1:
            raise OpenAIError("an agent session takes one prompt per /v1/completions request", param="prompt")
        st = None
        if params.stream:
            st = Streamer(request, "completion", stream_head("completion", params.model or self.model_name),
                          self.tok, params, params.stop, False, params.n)
        choices, all_gens, n_prompt, prompt_ids = [], [], 0, []
        for p in prompts:
            ids = p if isinstance(p, list) else await asyncio.to_thread(
                lambda s=p: list(self.tok(s, add_special_tokens=False)["input_ids"]))
            if not ids:
                raise OpenAIError("the prompt tokenizes to no tokens", param="prompt")
            try:
                sps = self._samplings(params, self._max_new(params, len(ids), session), session)
            except OpenAIError as e:
                if st is None or not st.sse.resp.prepared:
                    raise
                return await st.error(str(e), "invalid_request_error")     # a later prompt of a streamed batch
            if st is not None:
                if not st.sse.resp.prepared:
                    await st.sse.open()
                st.next_prompt(params.n, len(choices))
                try:
                    gens = await self._generate(ids, sps, st.progress)
                except (OpenAIError, ValueError) as e:
                    return await st.error(str(e), "invalid_request_error")
            else:
                gens = await self._generate(ids, sps)
            recorded = []
            for k, (gen, sp) in enumerate(zip(gens, sps)):
                text, n_text = response_text(self.tok, gen, sp, self.eos_ids)
                ch = {"index": len(choices), "text": text, "finish_reason": finish_reason(gen), "logprobs": None}
                if params.logprobs:
                    ch["logprobs"] = completion_logprobs(self.tok, gen.token_ids[:n_text], gen.logprobs[:n_text],
                                                         _tops(gen, params, n_text, self.engine))
                if params.return_token_ids:
                    ch["token_ids"] = list(gen.token_ids)
                    ch["weight_versions"] = _versions(gen)
                if st is not None:
                    await st.finish(k, gen, ch, n_text)
                choices.append(ch)
                recorded.append(Choice(list(gen.token_ids), list(gen.logprobs), _versions(gen), gen.finish_reason,
                                       text=text))
            if session is not None:
                session.record(Call("completion", list(ids), recorded))
            all_gens += gens
            n_prompt += len(ids)
            prompt_ids.append(list(ids))
        if st is not None:
            return await st.end(usage(n_prompt, all_gens))
        out = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", **self._id_fields(params),
               "choices": choices, "usage": usage(n_prompt, all_gens), "system_fingerprint": None}
        if params.return_token_ids:
            out["prompt_token_ids"] = prompt_ids if len(prompt_ids) > 1 else prompt_ids[0]
        return out


def _tops(gen: Generation, params: Params, n: int, engine: Any) -> Optional[list]:
    """The top logprobs of the first ``n`` tokens when asked. slick's engine, HTTP engines (slick serve, SGLang)
    and vLLM return them; a generation that came without them (another engine, or one resumed on another worker
    after a failure) is refused naming the engine."""
    if not params.top_logprobs:
        return None
    if gen.top_logprobs is None or len(gen.top_logprobs) < n:
        name = type(getattr(engine, "engine", engine)).__name__
        raise OpenAIError(f"this endpoint's engine ({name}) returned no top logprobs for this generation; send "
                          "top_logprobs 0", param="top_logprobs")
    return gen.top_logprobs[:n]


def _versions(gen: Generation) -> list[int]:
    if gen.weight_versions is not None:
        return [int(v) for v in gen.weight_versions]
    return [int(gen.weight_version)] * len(gen.token_ids)

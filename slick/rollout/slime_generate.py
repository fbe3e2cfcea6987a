"""slime's custom generate functions, run unchanged: ``async def generate(args, sample, sampling_params)``.

A ``--custom-generate-function-path`` function that takes three positional arguments is a slime plug-in (slick's
own take a fourth, the engine). For it slick

- serves SGLang's ``/generate`` (text or ``input_ids``, ``sampling_params``, ``return_logprob``) on a free
  127.0.0.1 port in the rollout's event loop (:class:`SGLangFront`); every request goes to the rollout's engine
  (the in-process engine, HTTP engines behind their client, train-async's interruptible engine), so aborts,
  weight updates and fault recovery apply to the plug-in's requests as to slick's own;
- passes ``args``: the run's flags as a namespace (``argparse.Namespace``) plus ``sglang_router_ip`` and
  ``sglang_router_port`` pointing at that front;
- passes the sample in slime's shape (``slick.compat.slime.utils.types.Sample``: ``tokens`` = prompt + response
  ids, ``prompt`` the prompt text, ``rollout_log_probs``, ``loss_mask``, ``status``, ...) and the rollout's
  sampling as an SGLang dict (seeded per sample, ``no_stop_trim`` true as in slime);
- copies the result back: ``tokens[-response_length:]`` are the response, ``loss_mask`` (all 1 when unset),
  ``status``, ``response``, ``metadata``; ``remove_sample`` sets the loss mask to 0.

Every generation the front served is kept (:class:`Ledger`) until a returned sample claims it: a run of
loss-mask-1 tokens that equals a served generation takes that generation's logprobs and per-token weight
versions, so the trainer gets the engine's numbers even when a plug-in drops or rounds them. A trainable token
no served generation accounts for keeps the plug-in's logprob (it must give one) and the engine's current
version; such tokens are counted in ``rollout/slime_unmatched_tokens``.
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import time
from typing import Any, Callable, Optional

from slick.compat.slime.rollout.sglang_rollout import register_tokenizer
from slick.compat.slime.utils.types import Sample as SlimeSample
from slick.compat.view import is_slime_plugin, to_slime  # noqa: F401  (re-exported)
from slick.config import Config
from slick.serve.http_body import BodyError, json_response, read_json
from slick.serve.http_guard import HostPolicy, guard_middleware
from slick.serve.http_protocol import GenerateItem, RequestError, generation_json, parse_generate, text_prompts
from slick.types import Generation, SamplingParams, Sample, Status

log = logging.getLogger("slick.rollout")

KEY = 8                 # a served generation is found by its first KEY tokens
LEDGER_CAP = 8192       # generations kept at most (the oldest go first)
NO_CONTEXT_LIMIT = 1 << 30
SLIME_DEFAULTS = dict(ci_test=False, use_rollout_routing_replay=False, sglang_server_concurrency=512,
                      rollout_skip_special_tokens=False, sglang_dp_size=None, router_policy=None,
                      sglang_enable_deterministic_inference=False)


def takes_engine(fn: Callable) -> bool:
    """Whether ``fn`` takes a fourth positional argument, the engine (slick's signature), rather than slime's three
    (and slime's optional ``evaluation``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len([p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.name != "evaluation"]) >= 4     # slime passes `evaluation=` by name when it is taken


class Ledger:
    """Generations the front served, found by their first tokens (module doc)."""

    def __init__(self):
        self._by_key: dict[tuple, list[Generation]] = {}
        self._count = 0

    def add(self, gen: Generation) -> None:
        if not gen.token_ids:
            return
        self._by_key.setdefault(tuple(gen.token_ids[:KEY]), []).append(gen)
        self._count += 1
        while self._count > LEDGER_CAP:
            oldest = next(iter(self._by_key))
            self._by_key[oldest].pop(0)
            self._count -= 1
            if not self._by_key[oldest]:
                del self._by_key[oldest]

    def take(self, ids: list[int], j: int) -> Optional[Generation]:
        """The longest served generation whose tokens are ``ids[j:j+len]``, removed from the ledger."""
        for k in range(min(KEY, len(ids) - j), 0, -1):
            found = [g for g in self._by_key.get(tuple(ids[j:j + k]), ())
                     if (len(g.token_ids) == k or k == KEY) and ids[j:j + len(g.token_ids)] == list(g.token_ids)]
            if found:
                g = max(found, key=lambda g: len(g.token_ids))
                self._by_key[tuple(ids[j:j + k])].remove(g)
                self._count -= 1
                return g
        return None


def fill_from_ledger(resp: list[int], mask: list[int], lps: Optional[list], ledger: Ledger,
                     version: int) -> tuple[list[float], list[int], int]:
    """(logprobs, per-token versions, trainable tokens no served generation accounts for) of a response."""
    n = len(resp)
    out_lp = [float(x) for x in lps] if lps is not None else [None] * n
    versions: list[int] = []
    j = unmatched = 0
    while j < n:
        if mask[j]:
            g = ledger.take(resp, j)
            if g is not None:
                k = len(g.token_ids)
                out_lp[j:j + k] = list(g.logprobs)
                versions += list(g.weight_versions) if g.weight_versions is not None else [g.weight_version] * k
                j += k
                continue
            unmatched += 1
            if out_lp[j] is None:
                raise ValueError(f"response token {j} ({resp[j]}) has loss mask 1 but no rollout_log_probs and no "
                                 f"generation served to the plug-in produced it")
        versions.append(versions[-1] if versions and not mask[j] else version)
        out_lp[j] = 0.0 if out_lp[j] is None else out_lp[j]
        j += 1
    return out_lp, versions, unmatched


def from_slime(s: SlimeSample, into: Sample, ledger: Ledger, version: int) -> int:
    """Copy slime sample ``s`` back into ``into`` (module doc); returns the unmatched trainable tokens."""
    if not isinstance(s, SlimeSample):
        raise TypeError(f"a slime custom generate must return its Sample, got {type(s).__name__} (slick trains one "
                        f"sample per generated sample; a list of samples is not offered)")
    n, tokens = int(s.response_length), [int(t) for t in s.tokens]
    if not 0 <= n <= len(tokens):
        raise ValueError(f"response_length {n} does not fit the sample's {len(tokens)} tokens")
    resp = tokens[len(tokens) - n:]
    mask = [int(m) for m in s.loss_mask] if s.loss_mask is not None else [1] * n
    lps = s.rollout_log_probs
    for name, xs in (("loss_mask", mask), ("rollout_log_probs", lps)):
        if xs is not None and len(xs) != n:
            raise ValueError(f"{name} has {len(xs)} entries for response_length {n}")
    out_lp, versions, unmatched = fill_from_ledger(resp, mask, lps, ledger, version)
    into.prompt_ids, into.response_ids = tokens[:len(tokens) - n], resp
    into.loss_mask = [0] * n if s.remove_sample else mask
    into.rollout_logprobs, into.weight_versions = out_lp, versions
    into.response, into.status = s.response or "", Status(s.status.value)
    into.metadata = s.metadata if isinstance(s.metadata, dict) else into.metadata
    return unmatched


class SGLangFront:
    """SGLang's ``/generate`` over the rollout's engine, on a free 127.0.0.1 port of the running event loop."""

    def __init__(self, engine: Callable[[], Any], tokenizer, eos_ids: set):
        self._engine, self.tok, self.eos_ids = engine, tokenizer, eos_ids
        self.ledger = Ledger()
        self._runner = self._loop = None
        self._starting: Optional[asyncio.Task] = None    # the one start of this loop's server, shared by callers
        self.port: Optional[int] = None

    async def start(self) -> int:
        """The server's port, started once per event loop: the concurrent first samples of a rollout share one
        start (each used to start a server of its own, and all but the last were never closed)."""
        loop = asyncio.get_running_loop()
        if self._starting is None or self._loop is not loop:
            self._loop, self._runner = loop, None
            self._starting = loop.create_task(self._start())
        try:
            return await asyncio.shield(self._starting)
        except Exception:
            self._starting = None     # a failed start is tried again by the next caller
            raise

    async def _start(self) -> int:
        from aiohttp import web

        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[guard_middleware(HostPolicy())])
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self._runner, self.port = runner, runner.addresses[0][1]
        log.info("SGLang /generate for slime plug-ins at http://127.0.0.1:%d", self.port)
        return self.port

    async def close(self) -> None:
        if self._starting is not None and self._loop is asyncio.get_running_loop():
            await asyncio.gather(self._starting, return_exceptions=True)
            if self._runner is not None:
                await self._runner.cleanup()
        self._runner = self._loop = self._starting = None

    async def health(self, request):
        from aiohttp import web

        return web.Response(text="")

    async def generate(self, request):
        try:
            body = await read_json(request)
            texts = text_prompts(body)
            ids = [self.tok(t, add_special_tokens=False)["input_ids"] for t in texts] if texts else None
            vocab = getattr(self._engine(), "vocab_size", None) or len(self.tok)
            limit = getattr(self._engine(), "max_context", None) or NO_CONTEXT_LIMIT
            req = parse_generate(body, vocab_size=vocab, max_context=limit, text_ids=ids)
            if req.stream:
                raise RequestError("stream is not offered to slime plug-ins: post without \"stream\"")
        except (RequestError, BodyError) as e:
            return json_response({"error": str(e)}, status=e.status)
        t0 = time.perf_counter()
        gens = await asyncio.gather(*(self._one(it) for it in req.items))
        out = [generation_json(g, it, text=self._text(g, it.sampling), return_logprob=req.return_logprob,
                               e2e_latency=time.perf_counter() - t0) for g, it in zip(gens, req.items)]
        return json_response(out if req.batched else out[0])

    async def _one(self, item: GenerateItem) -> Generation:
        engine = self._engine()
        if item.sampling.max_new_tokens == 0:
            return Generation([], [], "length", await engine.get_weight_version(), len(item.prompt_ids),
                              weight_versions=[])
        gen = await engine.generate(item.prompt_ids, item.sampling)
        self.ledger.add(gen)
        return gen

    def _text(self, gen: Generation, sp: SamplingParams) -> str:
        """The response text as SGLang makes it: the stop token or string cut off unless ``no_stop_trim``."""
        ids = list(gen.token_ids)
        trim = gen.finish_reason == "stop" and not sp.no_stop_trim
        if trim and ids and ids[-1] in (self.eos_ids | set(sp.stop_token_ids or ())):
            ids = ids[:-1]
        text = self.tok.decode(ids, skip_special_tokens=sp.skip_special_tokens)
        cuts = [i for i in (text.find(s) for s in (sp.stop or []) if s) if i >= 0] if trim else []
        return text[:min(cuts)] if cuts else text


class SlimeGenerate:
    """Runs a slime custom generate function for slick's samples (module doc)."""

    def __init__(self, fn: Callable, cfg: Config, engine: Callable[[], Any], tokenizer):
        self.fn, self.cfg, self._engine, self.tok = fn, cfg, engine, tokenizer
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.front = SGLangFront(engine, tokenizer, set(getattr(engine(), "eos_ids", ()) or ()) | eos)
        self.evaluation_kw = "evaluation" in inspect.signature(fn).parameters
        self.unmatched = 0
        register_tokenizer(cfg.hf_checkpoint, tokenizer)     # GenerateState(args).tokenizer is the run's

    def args(self, port: int) -> argparse.Namespace:
        values = {**SLIME_DEFAULTS, **self.cfg.flat()}
        return argparse.Namespace(**values, sglang_router_ip="127.0.0.1", sglang_router_port=port)

    def prompt_text(self, sample: Sample) -> str:
        if isinstance(sample.prompt, str) and not self.cfg.apply_chat_template:
            return sample.prompt
        return self.tok.decode(sample.prompt_ids, skip_special_tokens=False)

    async def __call__(self, sample: Sample, sampling: SamplingParams, evaluation: bool = False) -> Sample:
        args = self.args(await self.front.start())
        params = {**sampling.to_sglang(), "no_stop_trim": True, "skip_special_tokens": False}
        kw = {"evaluation": evaluation} if self.evaluation_kw else {}
        t0 = time.perf_counter()
        out = await self.fn(args, to_slime(sample, self.prompt_text(sample)), params, **kw)
        self.unmatched += from_slime(out, sample, self.front.ledger, await self._engine().get_weight_version())
        sample.timings["generate"] = sample.timings.get("generate", 0.0) + time.perf_counter() - t0
        return sample

    def metrics(self) -> dict:
        n, self.unmatched = self.unmatched, 0
        return {"rollout/slime_unmatched_tokens": float(n)}

"""LocalEngine: in-process generation with continuous batching over a functional transformer.

One scheduler owns the model. At every step it (1) drops cancelled requests, (2) admits queued
requests into free KV-cache slots -- identical prompts waiting together share one prefill whose keys and
values are copied into each slot, and a prefix common to all of them is computed once -- and samples their
first token, (3) runs one batched decode step for every running sequence. A finished sequence frees its slot at once. Results go back to the caller's
event loop with ``call_soon_threadsafe``, so any number of event loops may call one engine over its life.

The scheduler runs either in a background thread (``threaded=True``, the default on CUDA) or inline, as a
task of the caller's event loop that runs one step and yields (the default on CPU). Inline is ~1.5x faster on
CPU (bench/engine.py's batch: ~890 vs ~590 tok/s): torch's OpenMP team stays hot in the thread that also
trains, while a second thread pays a wake-up on every one of the ~200 kernels of a decode step. A step
(tens of ms) then blocks that loop briefly.
Weight updates, aborts and ``pause_generation`` take the step lock, i.e. they happen between two steps.
While paused no step runs: running requests keep their KV cache, queued ones wait, and every token records the
weight version that sampled it (``Generation.weight_versions``), so pause -> update_weights -> continue
switches a request's versions exactly at the pause point.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Iterable, Optional

import torch

from slick.engine.batching import ContinuousBatching
from slick.engine.kvcache import KVCache
from slick.engine.lora_merge import LoraDelta, is_adapter_dir, merged_weights, read_adapter_dir
from slick.engine.model import Transformer, iter_safetensors, pick_dtype
from slick.engine.request import Request, deliver
from slick.engine.grammar import Grammars, constraint_of
from slick.engine.grammar_check import GrammarChecker     # new grammars compile in a helper process first
from slick.engine.limits import RequestLimits             # stop strings, grammar size/depth/time per request
from slick.engine.sampling import validate_sampling
from slick.engine.scoring import as_dicts, prompt_logprobs
from slick.engine.weight_check import check_dir, check_named
from slick.models.tokenizer import load_tokenizer
from slick.types import Generation, SamplingParams

log = logging.getLogger("slick.engine")



class LocalEngine(ContinuousBatching):
    """In-process engine implementing :class:`slick.engine.base.Engine` for Llama/Qwen2/Qwen3/Mistral.

    ``dtype``: "auto" (bf16 on CUDA or on CPUs with AVX512-BF16/AMX, else fp32), "bf16" or "fp32".
    ``max_running``: concurrent sequences (KV-cache slots). ``max_seq_len``: context cap (prompt +
    response); defaults to the model's ``max_position_embeddings`` (or its sliding window if smaller).
    ``seed`` seeds the random streams of requests that do not carry their own ``SamplingParams.seed``.
    ``threaded``: run the scheduler in a background thread (default: only on CUDA; see the module doc).
    ``limits``: what one request may ask (:class:`slick.engine.limits.RequestLimits`; default: its defaults).
    """

    def __init__(self, model_path: str | Path, dtype: str = "auto", device: str = "auto", max_running: int = 64,
                 max_seq_len: Optional[int] = None, seed: int = 0, threaded: Optional[bool] = None,
                 limits: Optional[RequestLimits] = None):
        t0 = time.perf_counter()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.dtype = pick_dtype(dtype, self.device)
        self.model_path = str(model_path)
        self.model = Transformer.load(model_path, self.dtype, self.device)
        cfg = self.model.cfg

        self.tokenizer = load_tokenizer(self.model_path)
        self.vocab_size = cfg.vocab_size
        ctx = cfg.max_position if cfg.window is None else min(cfg.max_position, cfg.window)
        if max_seq_len is not None:
            if max_seq_len < 2:
                raise ValueError(f"max_seq_len={max_seq_len} must be >= 2")
            ctx = min(ctx, int(max_seq_len))
        self.max_context = ctx
        if max_running < 1:
            raise ValueError(f"max_running={max_running} must be >= 1")
        self.max_running = int(max_running)
        self.eos_ids = _eos_ids(self.tokenizer, Path(self.model_path))
        self.limits = limits if limits is not None else RequestLimits()
        checker = GrammarChecker(self.model_path, self.vocab_size, self.eos_ids, self.limits.grammar_timeout_s)
        self._grammars = Grammars(self.tokenizer, self.vocab_size, self.eos_ids, checker,   # json_schema / regex / ebnf
                                  timeout_s=self.limits.grammar_timeout_s)
        self.cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device,
                             self.max_running, self.max_context)
        self._rng = random.Random(seed)
        self._version = 0
        self._queue: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []          # index == KV slot
        self._by_rid: dict[str, Request] = {}       # requests in flight (queued or running) by rid
        self._cv = threading.Condition()
        self._step_lock = threading.Lock()
        self._control = 0        # control calls waiting for the step lock; the scheduler thread yields to them
        self._closed = False
        self._paused = False
        self._counters = collections.Counter()
        self._recent: collections.deque = collections.deque(maxlen=512)   # (time, tokens) per step
        self.threaded = self.device.type == "cuda" if threaded is None else bool(threaded)
        self._pump_task: Optional[asyncio.Task] = None
        self._thread = None
        if self.threaded:
            self._thread = threading.Thread(target=self._run, name="slick-local-engine", daemon=True)
            self._thread.start()
        log.info("LocalEngine loaded %s (%s, %d layers) as %s on %s in %.2fs; max_context=%d max_running=%d",
                 self.model_path, cfg.model_type, cfg.num_layers, str(self.dtype).replace("torch.", ""),
                 self.device, time.perf_counter() - t0, self.max_context, self.max_running)

    # ------------------------------------------------------------------ public API
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       rid: Optional[str] = None) -> Generation:
        """Generate a response for ``prompt_ids``; see :class:`slick.types.Generation` for the result.

        ``rid`` names the request for :meth:`abort` (default: a fresh uuid); a rid already in flight is a
        ``ValueError``. While the engine is paused the request is queued and starts at ``continue_generation``.
        Bad sampling settings (a seed out of range, a NaN temperature, ...) raise
        :class:`slick.engine.sampling.SamplingError` (a ValueError) before anything is queued.
        """
        prompt = self._check_prompt(prompt_ids)
        sp = validate_sampling(sampling if sampling is not None else SamplingParams(), "sampling")
        self.limits.check_sampling(sp, "sampling")    # a LimitError (ValueError) names the limit and its flag
        if self._closed:
            raise RuntimeError("LocalEngine is closed")
        if self.model.released:
            raise RuntimeError("LocalEngine: the weights are released (release_memory); update_weights "
                               "before generating")
        rid = uuid.uuid4().hex if rid is None else rid
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"rid must be a non-empty string, got {rid!r}")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        rng = torch.Generator(device=self.device)
        rng.manual_seed(int(sp.seed) if sp.seed is not None else self._rng.getrandbits(63))
        max_new = max(0, min(int(sp.max_new_tokens), self.max_context - len(prompt)))
        # ignore_eos drops the stop tokens, as in SGLang (EOS and stop_token_ids); stop strings still apply
        stop_ids = set() if sp.ignore_eos else set(self.eos_ids) | set(int(t) for t in (sp.stop_token_ids or ()))
        stop_strs = [s for s in (sp.stop or ()) if s]
        req = Request(rid, prompt, sp, loop, fut, rng, max_new, stop_ids, stop_strs)
        if constraint_of(sp, "sampling") is not None:     # compiled off the loop; a bad grammar is a ValueError
            req.matcher = await asyncio.to_thread(self._grammars.matcher, sp, "sampling")
        if max_new == 0:
            return Generation([], [], "length", self._version, len(prompt), "", weight_versions=[])
        with self._cv:
            if rid in self._by_rid:
                raise ValueError(f"a request with rid {rid!r} is already in flight")
            self._by_rid[rid] = req
            self._queue.append(req)
            self._cv.notify()
        if not self.threaded:
            self._ensure_pump(loop)
        try:
            gen = await fut
        except asyncio.CancelledError:
            req.cancelled = True
            raise
        finally:
            with self._cv:
                if self._by_rid.get(rid) is req:
                    del self._by_rid[rid]
        gen.text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return gen

    async def update_weights(self, named_tensors: Optional[Iterable] = None, path: Optional[str] = None,
                             version: Optional[int] = None) -> int:
        """Copy new weights in between two scheduler steps; return the new weight version.

        ``named_tensors``: iterable of ``(hf_name, tensor)`` (any floating dtype/device; cast on copy).
        ``path``: a HF directory whose safetensors are read, or a PEFT adapter directory (merged into the base:
        :meth:`update_adapter`). ``version``: set instead of incrementing.
        All or nothing: every file, name, shape and dtype is checked before any weight changes; a bad update
        raises :class:`slick.engine.weight_check.WeightUpdateError` (a ValueError naming the file and tensor)
        and leaves the weights and the version as they were.
        """
        if not self.threaded:  # between two steps already: we run in the scheduler's thread
            return self.update_weights_sync(named_tensors, path, version)
        return await asyncio.to_thread(self.update_weights_sync, named_tensors, path, version)

    def update_weights_sync(self, named_tensors=None, path=None, version=None) -> int:
        """Blocking form of :meth:`update_weights` (for callers without an event loop)."""
        if (named_tensors is None) == (path is None):
            raise ValueError("update_weights: pass exactly one of named_tensors or path")
        if path is not None and is_adapter_dir(path):   # a PEFT adapter: merged on arrival (slick.engine.lora_merge)
            return self.update_adapter_sync(read_adapter_dir(path), version)
        t0 = time.perf_counter()
        need = self.model.required_names()   # all the released ones, after release_memory
        if path is not None:       # checked first (headers only, outside the step lock), then copied
            named = iter_safetensors(check_dir(self.model.shapes, path, need))
        else:
            named = check_named(self.model.shapes, named_tensors, need)
        with self._between_steps():
            seen = self.model.copy_named(named, strict=True)
            for r in self._running:          # their prompts' KV and logits are of the old weights
                r.prompt_logits = None
            self._version = int(version) if version is not None else self._version + 1
        log.info("weights updated (%d tensors) -> version %d in %.2fs", len(seen), self._version,
                 time.perf_counter() - t0)
        return self._version

    async def update_adapter(self, delta: LoraDelta, version: Optional[int] = None) -> int:
        """Merge a LoRA adapter into the base weights of this engine's model directory (``slick.engine.lora_merge``:
        ``W = W_base + scaling * B @ A`` for every adapted weight) and take ``version``; all or nothing, as
        :meth:`update_weights`. Returns the new weight version."""
        if not self.threaded:
            return self.update_adapter_sync(delta, version)
        return await asyncio.to_thread(self.update_adapter_sync, delta, version)

    def update_adapter_sync(self, delta: LoraDelta, version: Optional[int] = None) -> int:
        """Blocking form of :meth:`update_adapter`."""
        extra = self.model.required_names() - set(delta.pairs)   # after release_memory: the rest from the base too
        named = merged_weights(self.model.shapes, delta, self.model_path, extra)
        return self.update_weights_sync(named_tensors=named, version=version)

    async def accepts_adapters(self) -> bool:
        """LoRA adapters may be sent alone (:meth:`update_adapter`, or a PEFT directory to :meth:`update_weights`)."""
        return True

    async def release_memory(self) -> int:
        """Free the KV cache and the packed weight copies while the engine is idle (a colocated trainer's
        step, ``--offload-rollout``); returns the bytes freed. The next :meth:`update_weights` must send every
        weight and restores them; the cache grows again with the next requests. Refused while requests are
        running or queued; generating before the update is refused."""
        with self._between_steps():
            busy = len(self._running) + len(self._queue)
            if busy:
                raise RuntimeError(f"LocalEngine.release_memory: {busy} request(s) running or queued; "
                                   "memory is released only between rollouts")
            kv = self.cache.release()
            weights = self.model.release_weights()
        log.info("released %.0f MiB (KV cache %.0f, packed weights %.0f) until the next weight update",
                 (kv + weights) / 2**20, kv / 2**20, weights / 2**20)
        return kv + weights

    async def abort_all(self) -> None:
        """Finish every running and queued request now with finish reason "abort" (partial output kept)."""
        if not self.threaded:
            return self._abort_all_sync()
        await asyncio.to_thread(self._abort_all_sync)

    async def abort(self, rid: str) -> None:
        """Finish request ``rid`` now with finish reason "abort", keeping its tokens so far; other requests
        are untouched. An unknown or finished ``rid`` is a no-op. Works while paused."""
        if not self.threaded:
            return self._abort_sync(rid)
        await asyncio.to_thread(self._abort_sync, rid)

    def _abort_sync(self, rid: str) -> None:
        with self._between_steps():
            with self._cv:
                r = self._by_rid.get(rid)
                if r is None:
                    return
                if r in self._queue:
                    self._queue.remove(r)
                else:
                    idx = [i for i, x in enumerate(self._running) if x is r]
                    if not idx:
                        return
                    self._release(idx)
            self._finish(r, "abort")
            self._counters["aborted"] += 1

    async def pause_generation(self) -> None:
        """Stop decoding in place: when this returns no step is running and none starts until
        :meth:`continue_generation`. Running requests keep their KV cache, queued and new ones wait;
        ``update_weights``, ``abort`` and ``abort_all`` work meanwhile. Pausing twice is a no-op."""
        if not self.threaded:
            return self._pause_sync()
        await asyncio.to_thread(self._pause_sync)

    def _pause_sync(self) -> None:
        with self._cv:
            self._paused = True
        with self._between_steps():    # a step already under way finishes first; later ones see the flag
            pass

    async def continue_generation(self) -> None:
        """Resume after :meth:`pause_generation` under whatever weights are loaded now (no-op if not paused)."""
        with self._cv:
            self._paused = False
            self._cv.notify_all()
        if not self.threaded and (self._queue or self._running):
            self._ensure_pump(asyncio.get_running_loop())

    @property
    def paused(self) -> bool:
        """True between :meth:`pause_generation` and :meth:`continue_generation`."""
        return self._paused

    def progress(self) -> dict[str, int]:
        """``{rid: tokens generated so far}`` for every request in flight (queued requests have 0).
        Exact while paused: the counts a pause stopped at."""
        with self._cv:
            return {rid: len(r.out) for rid, r in self._by_rid.items()}

    def partial(self, rid: str, start: int = 0, tops: bool = False) -> Optional[tuple]:
        """(tokens, logprobs, per-token versions) request ``rid`` has generated so far, from token ``start`` on;
        None when it is not in flight. ``tops``: a fourth item, the top logprobs of those tokens (or None)."""
        with self._cv:
            r = self._by_rid.get(rid)
            if r is None:
                return None
            n = min(len(r.out), len(r.lps), len(r.versions))
            part = list(r.out[start:n]), list(r.lps[start:n]), list(r.versions[start:n])
            return part + ((list(r.tops[start:n]) if r.sp.top_logprobs_num else None,) if tops else ())

    def _abort_all_sync(self) -> None:
        with self._between_steps():
            with self._cv:
                reqs = list(self._running) + list(self._queue)
                self._running.clear()
                self._queue.clear()
            for r in reqs:
                self._finish(r, "abort")
            self._counters["aborted"] += len(reqs)

    async def health(self) -> bool:
        """True while the engine is open (and its scheduler thread alive, when threaded)."""
        return (not self._closed) and (self._thread is None or self._thread.is_alive())

    async def prompt_logprobs(self, token_ids: list[int], k: int = 0) -> tuple[list, list]:
        """``(token_logprobs, top)`` for positions 0..n-2 of ``token_ids`` under the current weights, at T=1:
        ``token_logprobs[i]`` is the logprob of ``token_ids[i + 1]``, ``top[i]`` the ``k`` most likely next tokens
        as ``(id, logprob)`` (slick/engine/scoring.py). One forward between two scheduler steps; the KV cache and
        the requests in flight are untouched."""
        ids = list(token_ids)
        head = self._check_prompt(ids[:-1] or ids)     # ids in the vocabulary, at most the context
        ids = head + self._check_prompt(ids[-1:]) if len(ids) > 1 else head
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.vocab_size:
            raise ValueError(f"k must be an integer in [0, {self.vocab_size}], got {k!r}")
        if self._closed:
            raise RuntimeError("LocalEngine is closed")
        if not self.threaded:   # the scheduler runs in this thread: between two steps already
            return prompt_logprobs(self.model, ids, k)
        return await asyncio.to_thread(self._prompt_logprobs_sync, ids, k)

    def _prompt_logprobs_sync(self, ids: list[int], k: int) -> tuple[list, list]:
        with self._between_steps():
            return prompt_logprobs(self.model, ids, k)

    async def prompt_top_logprobs(self, token_ids: list[int], k: int) -> list[dict]:
        """``[{token: logprob}]`` for positions 0..n-2 of ``token_ids``: the top-``k`` next-token logprobs at T=1
        plus the token that follows (``top[i]`` predicts ``token_ids[i + 1]``); the contract of
        ``VllmEngine.prompt_top_logprobs`` (the mismatch probe, an OPD teacher)."""
        token_lps, top = await self.prompt_logprobs(token_ids, k)
        return as_dicts(token_ids, token_lps, top)

    def weight_shapes(self) -> dict[str, tuple]:
        """HF weight name -> shape of every weight an update may write (what a broadcast bucket may announce)."""
        return dict(self.model.shapes)

    async def get_weight_version(self) -> int:
        """The current weight version (0 after load, +1 per update unless set)."""
        return self._version

    async def close(self) -> None:
        """Stop the scheduler thread; outstanding requests finish with "abort"."""
        if not self.threaded:
            return self.close_sync()
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Blocking form of :meth:`close`."""
        if self._closed:
            return
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._abort_all_sync()
        self._grammars.close()

    def stats(self) -> dict:
        """Counters for /metrics: running, queued, generated_tokens_total, tokens_per_sec (last ~10 s), ..."""
        now = time.perf_counter()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= 10.0]
        tps = 0.0
        if recent:
            span = max(now - recent[0][0], 1e-3)
            tps = sum(n for _, n in recent) / span
        c = self._counters
        return {"running": len(self._running), "queued": len(self._queue),
                "generated_tokens_total": c["tokens"], "tokens_per_sec": tps,
                "prefills": c["prefills"], "prefill_tokens": c["prefill_tokens"],
                "prefix_reused_tokens": c["prefix_reused_tokens"], "prompt_reused_tokens": c["prompt_reused_tokens"],
                "decode_steps": c["decode_steps"], "requests_finished": c["finished"],
                "aborted": c["aborted"], "weight_version": self._version, "paused": self._paused,
                "kv_cache_bytes": self.cache.nbytes(), "max_running": self.max_running,
                "max_context": self.max_context}

    # ------------------------------------------------------------------ scheduler thread
    def _check_prompt(self, prompt_ids) -> list[int]:
        try:
            prompt = [int(t) for t in prompt_ids]
        except (TypeError, ValueError) as e:
            raise ValueError(f"prompt_ids must be a list of integers: {e}") from e
        if not prompt:
            raise ValueError("prompt_ids is empty")
        bad = [t for t in prompt if t < 0 or t >= self.vocab_size]
        if bad:
            raise ValueError(f"prompt_ids contains token ids outside [0, {self.vocab_size}): {bad[:5]}")
        if len(prompt) >= self.max_context:
            raise ValueError(f"prompt has {len(prompt)} tokens; the context limit is {self.max_context}")
        return prompt

    @contextlib.contextmanager
    def _between_steps(self):
        """Hold the step lock for a control call (weights, aborts, pause). The threaded scheduler sees the
        waiting call and stops taking the lock after its current step (a plain Lock is not fair: a thread that
        releases and re-takes it at once could starve the caller until every request finished)."""
        with self._cv:
            self._control += 1
        try:
            with self._step_lock:
                yield
        finally:
            with self._cv:
                self._control -= 1
                self._cv.notify_all()

    def _run(self) -> None:
        """The background scheduler thread (threaded mode)."""
        torch.set_grad_enabled(False)
        while True:
            with self._cv:
                while not self._closed and (self._paused or self._control or (not self._queue and not self._running)):
                    self._cv.wait()
                if self._closed:
                    return
            self._guarded_step()

    def _ensure_pump(self, loop: asyncio.AbstractEventLoop) -> None:
        """Inline mode: make sure a scheduler task runs in this event loop."""
        t = self._pump_task
        if t is None or t.done() or t.get_loop() is not loop:
            self._pump_task = loop.create_task(self._pump())

    async def _pump(self) -> None:
        """Inline mode: one step at a time until idle, yielding to the event loop in between."""
        while not self._closed and not self._paused and (self._queue or self._running):
            with torch.no_grad():
                self._guarded_step()
            await asyncio.sleep(0)

    def _guarded_step(self) -> None:
        with self._step_lock:
            if self._paused:       # set while this thread waited for the lock
                return
            try:
                self._step()
            except Exception as e:  # never let the scheduler die: fail the requests in flight
                log.exception("LocalEngine step failed")
                with self._cv:
                    reqs = list(self._running)
                    self._running.clear()
                for r in reqs:
                    deliver(r, exc=RuntimeError(f"LocalEngine step failed: {e!r}"))

def _eos_ids(tokenizer, path: Path) -> list[int]:
    """EOS ids from the tokenizer and from generation_config.json (int or list)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gc = path / "generation_config.json"
    if gc.is_file():
        try:
            e = json.loads(gc.read_text()).get("eos_token_id")
        except json.JSONDecodeError as err:
            raise ValueError(f"{gc}:{err.lineno}: invalid JSON: {err.msg}") from err
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, list):
            ids.update(int(x) for x in e)
    return sorted(ids)

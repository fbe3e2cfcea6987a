"""One step of LocalEngine's continuous batching: drop cancelled requests, admit queued ones into free KV-cache
slots (identical prompts share one prefill, a prompt identical to a running request's copies its KV and logits
while the weights are the same, a prefix common to all is computed once), one batched decode step,
sampling (grammar masks, top logprobs) and finishing.

:class:`ContinuousBatching` is the scheduler half of :class:`slick.engine.local.LocalEngine`, which owns the
state it works on (``model``, ``cache``, ``device``, ``tokenizer``, ``max_running``, the ``_queue`` and ``_running``
requests, ``_by_rid``, the ``_cv`` condition, ``_counters``, ``_recent`` and ``_version``) and calls :meth:`_step`
under its step lock.
"""
from __future__ import annotations

import time
from typing import Optional

import torch

from slick.engine.grammar import advance, apply_masks, finished
from slick.engine.request import Request, deliver
from slick.engine.routing_record import decode_rows, prefill_rows, routed_experts
from slick.engine.sampling import sample, top_logprobs
from slick.types import Generation

PREFILL_TOKEN_BUDGET = 8192     # padded prompt tokens per prefill forward
MIN_SHARED_PREFIX = 8           # prompts admitted together that share at least this many leading tokens
                                # (a system prompt, a chat template) compute that prefix once


class ContinuousBatching:
    """The scheduler step of :class:`slick.engine.local.LocalEngine` (see the module doc)."""

    def _step(self) -> None:
        self._drop_cancelled()
        self._admit()
        if self._running:
            self._decode()

    def _drop_cancelled(self) -> None:
        done = [i for i, r in enumerate(self._running) if r.cancelled]
        self._release(done)
        self._counters["aborted"] += len(done)     # the caller went away (a client that disconnected)

    def _release(self, idxs: list[int]) -> None:
        """Remove running requests at ``idxs``; keep slots dense by moving the last into each hole."""
        for i in sorted(idxs, reverse=True):
            j = len(self._running) - 1
            if i != j:
                last = self._running[j]
                self.cache.move(j, i, last.cached)
                self._running[i] = last
            self._running.pop()

    def _admit(self) -> None:
        new: list[Request] = []
        with self._cv:
            while self._queue and len(self._running) + len(new) < self.max_running:
                r = self._queue.popleft()
                if not r.cancelled:
                    new.append(r)
                else:
                    self._counters["aborted"] += 1
        if not new:
            return
        B0 = len(self._running)
        need = max(len(r.prompt) + r.max_new for r in self._running + new)
        self.cache.ensure(B0 + len(new), need)
        donors = {tuple(r.prompt): i for i, r in enumerate(self._running) if r.prompt_logits is not None}
        self._running.extend(new)
        groups: dict[tuple, list[int]] = {}
        for k, r in enumerate(new):
            groups.setdefault(tuple(r.prompt), []).append(B0 + k)
        logit_rows: dict[int, torch.Tensor] = {}
        routes: dict[int, torch.Tensor] = {}    # slot -> its prompt's routing (MoE models; routing_record.py)
        uniq = []
        for p, slots in groups.items():
            if p in donors:      # a running request has this prompt's KV and logits: copy, no forward
                self.cache.broadcast(donors[p], slots, len(p))
                logit_rows.update((s, self._running[donors[p]].prompt_logits) for s in slots)
                routes.update((s, r0) for r0 in self._running[donors[p]].routing[:1] for s in slots)
                self._counters["prompt_reused_tokens"] += len(p) * len(slots)
            else:
                uniq.append((p, slots))
        start = _shared_prefix([p for p, _ in uniq])
        if start:   # compute the common prefix once, in the first group's slot, and copy it to the others
            first = uniq[0][1][0]
            self._prefill([(uniq[0][0][:start], [first])])
            prefix = self._routing[0] if self._routing else None
            self.cache.broadcast(first, [slots[0] for _, slots in uniq[1:]], start)
            self._counters["prefix_reused_tokens"] += start * (len(uniq) - 1)
        chunk: list = []
        for item in uniq + [None]:
            if item is not None:
                plen = max([len(p) - start for p, _ in chunk + [item]])
                if not chunk or plen * (len(chunk) + 1) <= PREFILL_TOKEN_BUDGET:
                    chunk.append(item)
                    continue
            if not chunk:
                break
            logits = self._prefill(chunk, start)
            for row, (p, slots) in enumerate(chunk):
                if self._routing:
                    rt = self._routing[row]
                    routes.update((s, torch.cat([prefix, rt]) if start else rt) for s in slots)
                for s in slots[1:]:
                    self.cache.copy(slots[0], s, len(p))
                own = logits[row].clone()    # kept by the requests (prompt_logits): not a view of the chunk's
                for s in slots:
                    logit_rows[s] = own
            chunk = [item] if item is not None else []
        slots = list(range(B0, B0 + len(new)))
        for r, s in zip(new, slots):
            r.cached = len(r.prompt)
            r.prompt_logits = logit_rows[s]
            r.routing = [routes[s]] if s in routes else []
        logits = torch.stack([logit_rows[s] for s in slots])
        self._sample_and_finish(logits, slots)

    def _prefill(self, chunk: list, start: int = 0) -> torch.Tensor:
        """Prefill ``(prompt, slots)`` items into each item's first slot from position ``start`` (the positions
        before it are already cached); return the logits at each prompt's last token."""
        P = max(len(p) for p, _ in chunk) - start
        toks = torch.zeros(len(chunk), P, dtype=torch.long)
        for row, (p, _) in enumerate(chunk):
            toks[row, :len(p) - start] = torch.tensor(p[start:], dtype=torch.long)
        lens = torch.tensor([len(p) - start for p, _ in chunk], dtype=torch.long)
        slots = torch.tensor([s[0] for _, s in chunk], dtype=torch.long)
        dev = self.device
        out = self.model.prefill(toks.to(dev), lens.to(dev), slots.to(dev), self.cache, start)
        self._routing = prefill_rows(self.model, chunk, start)   # per item, MoE models only (else None)
        self._counters["prefills"] += len(chunk)
        self._counters["prefill_tokens"] += int(lens.sum())
        return out

    def _decode(self) -> None:
        run = self._running
        toks = torch.tensor([r.out[-1] for r in run], dtype=torch.long, device=self.device)
        pos_list = [r.cached for r in run]
        pos = torch.tensor(pos_list, dtype=torch.long, device=self.device)
        logits = self.model.decode(toks, pos, self.cache, max(pos_list) + 1)
        decode_rows(self.model, run)
        for r in run:
            r.cached += 1
        self._counters["decode_steps"] += 1
        self._sample_and_finish(logits, list(range(len(run))))

    def _sample_and_finish(self, logits: torch.Tensor, slots: list[int]) -> None:
        reqs = [self._running[s] for s in slots]
        matchers = [r.matcher for r in reqs]
        constrained = any(m is not None for m in matchers)
        if constrained:          # the grammar's mask: logprobs are of the distribution sampled from
            logits = apply_masks(logits, matchers, self.eos_ids)
        ntop = [r.sp.top_logprobs_num for r in reqs]
        tops = top_logprobs(logits, [r.sp.temperature for r in reqs], ntop) if any(ntop) else None
        tokens, lps = sample(logits, [r.sp.temperature for r in reqs], [r.sp.top_p for r in reqs],
                             [r.sp.top_k for r in reqs], [r.rng for r in reqs], native=self.model.native)
        if constrained:
            advance(matchers, tokens)
        done = []
        for k, (s, r, t, lp) in enumerate(zip(slots, reqs, tokens, lps)):
            if tops is not None and ntop[k]:
                r.tops.append(tops[k])
            r.out.append(t)
            r.lps.append(lp)
            r.versions.append(self._version)
            reason = self._finish_reason(r, t)
            if reason:
                done.append(s)
                self._finish(r, reason)
        self._counters["tokens"] += len(tokens)
        self._recent.append((time.perf_counter(), len(tokens)))
        with self._cv:
            self._release(done)

    def _finish_reason(self, r: Request, tok: int) -> Optional[str]:
        if tok in r.stop_ids or finished(r.matcher):
            return "stop"
        if r.stop_strs:
            tail = self.tokenizer.decode(r.out[-r.stop_tail:])
            if any(s in tail for s in r.stop_strs):
                return "stop"
        if len(r.out) >= r.max_new:
            return "length"
        return None

    def _finish(self, r: Request, reason: str) -> None:
        self._counters["finished"] += 1
        with self._cv:
            if self._by_rid.get(r.rid) is r:
                del self._by_rid[r.rid]
        deliver(r, Generation(list(r.out), list(r.lps), reason, self._version, len(r.prompt),
                               weight_versions=list(r.versions), routed_experts=routed_experts(r),
                               top_logprobs=list(r.tops) if r.sp.top_logprobs_num else None))


def _shared_prefix(prompts: list) -> int:
    """Leading tokens common to all ``prompts`` (at least two), if ``MIN_SHARED_PREFIX`` or more; else 0.
    Every prompt keeps one token of its own so that its prefill yields its next-token logits."""
    if len(prompts) < 2:
        return 0
    lo, hi = min(prompts), max(prompts)          # the common prefix of all is that of the extremes
    n = min(len(p) for p in prompts) - 1
    i = 0
    while i < n and lo[i] == hi[i]:
        i += 1
    return i if i >= MIN_SHARED_PREFIX else 0

"""LocalEngine's per-request state and how a result reaches the caller's event loop."""
from __future__ import annotations

from typing import Optional

from slick.types import Generation


class Request:
    """One request of LocalEngine: its prompt, sampling state and output so far."""

    __slots__ = ("rid", "prompt", "sp", "loop", "future", "out", "lps", "versions", "rng", "max_new", "stop_ids",
                 "stop_strs", "stop_tail", "cancelled", "cached", "matcher", "tops", "prompt_logits", "routing")

    def __init__(self, rid, prompt, sp, loop, future, rng, max_new, stop_ids, stop_strs):
        self.rid, self.prompt, self.sp, self.loop, self.future = rid, prompt, sp, loop, future
        self.out: list[int] = []
        self.lps: list[float] = []
        self.versions: list[int] = []   # weight version that sampled each token of ``out``
        self.rng, self.max_new, self.stop_ids, self.stop_strs = rng, max_new, stop_ids, stop_strs
        self.stop_tail = max((len(s) for s in stop_strs), default=0) + 8   # tokens to decode for stop check
        self.cancelled = False
        self.cached = 0          # positions of this sequence held in the KV cache
        self.matcher = None      # grammar constraint (slick/engine/grammar.py), or None
        self.tops: list = []     # per token: [(id, logprob), ...] when sp.top_logprobs_num > 0
        self.routing: list = []  # MoE models: [tokens, layers, k] uint8 pieces, prompt first (routing_record.py)
        self.prompt_logits = None  # logits at the prompt's last token, under the current weights (None after a
                                   # weight update): a later request with the same prompt copies this one's KV


def deliver(r: Request, gen: Optional[Generation] = None, exc: Optional[BaseException] = None) -> None:
    """Hand a result (or an exception) to the caller's event loop, from any thread."""
    def _set():
        if r.future.done():
            return
        if exc is not None:
            r.future.set_exception(exc)
        else:
            r.future.set_result(gen)

    try:
        r.loop.call_soon_threadsafe(_set)
    except RuntimeError:  # the caller's event loop is closed; nobody is waiting any more
        pass

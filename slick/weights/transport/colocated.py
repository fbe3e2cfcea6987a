"""The colocated transport: in-process engines get the tensors themselves.

The sender and the engine live in one process (``--rollout-engine local``, or a trainer rank actor that hosts
its engine, as ``--colocate`` does on CPU). ``send`` hands every engine the same ``(name, tensor)`` list; the
engine checks all of it, then copies (casting to its dtype/device) between two decode steps. Nothing is
serialised, nothing touches disk. Engines in another process are refused at ``connect``: use ``broadcast``
(gloo over loopback on one node) or ``disk``.
"""
from __future__ import annotations

from typing import Sequence

from slick.weights.transport.common import TransportError, engine_name, is_http, on_every_engine


class ColocatedTransport:
    name = "colocated"

    def __init__(self, *, timeout_s: float):
        self.timeout_s = float(timeout_s)
        self.engines: list = []
        self.last_bytes = 0          # tensor bytes handed over by the last send

    async def connect(self, engines: Sequence) -> None:
        remote = [engine_name(e) for e in engines if is_http(e)]
        if remote:
            raise TransportError(f"the colocated weight transport hands tensors to engines in this process; "
                                 f"engine(s) {', '.join(remote)} are behind HTTP (use broadcast or disk)")
        self.engines = list(engines)

    async def send(self, version: int, named_tensors) -> None:
        pairs = [(n, t.detach()) for n, t in named_tensors]
        self.last_bytes = sum(t.numel() * t.element_size() for _, t in pairs)
        await on_every_engine(self.engines, lambda e: e.update_weights(named_tensors=pairs, version=version),
                              self.timeout_s, f"update to version {version}")

    async def send_adapter(self, version: int, payload) -> None:
        """A LoRA adapter alone (``slick.weights.lora_sync``): every engine merges it into its base on arrival."""
        delta = payload.delta()
        self.last_bytes = payload.nbytes
        await on_every_engine(self.engines, lambda e: e.update_adapter(delta, version=version),
                              self.timeout_s, f"adapter update to version {version}")

    async def disconnect(self) -> None:
        self.engines = []

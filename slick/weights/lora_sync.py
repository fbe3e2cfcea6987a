"""Adapter-only weight sync: what a LoRA trainer sends to engines that merge the adapter on arrival.

A LoRA run's trainer (``slick.train.lora.PolicyLora``) changes only its adapters. When every engine of a sync
accepts an adapter (``await engine.accepts_adapters()``: slick's LocalEngine, ``slick serve`` workers, vLLM servers
started with LoRA enabled), the weight transport carries an :class:`AdapterPayload` (PEFT's adapter config and
its ``lora_A``/``lora_B`` tensors, fp32) instead of the merged weights:

* ``colocated``: the engines get the adapter's tensors themselves (``engine.update_adapter``);
* ``disk``: the payload is written as a PEFT adapter directory (``slick.weights.transport.disk.write_adapter_dir``:
  ``adapter_config.json``, ``adapter_model.safetensors`` and the transport's version marker, atomically) and every
  engine loads it (``update_weights(path=...)``, over HTTP ``/update_weights_from_disk``; vLLM:
  ``/v1/load_lora_adapter``).

Anything else (the broadcast transport, SGLang servers, engines that do not say they accept adapters) gets the
merged full weights, as a full fine-tuning run does. Either way the weight check after the sync
(``slick.weights.check``) compares the engines' version and a probe's logprobs with the trainer's.
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Sequence

from slick.engine.lora_merge import LoraDelta, parse_peft


@dataclass(frozen=True)
class AdapterPayload:
    """A LoRA adapter as it travels: ``config`` (PEFT's ``adapter_config.json`` as a dict) and ``tensors`` (PEFT's
    state-dict names, ``base_model.model.<module>.lora_A.weight`` / ``lora_B``)."""

    config: dict
    tensors: dict

    @property
    def nbytes(self) -> int:
        """Bytes of the adapter's tensors: sum of numel x element size."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def delta(self) -> LoraDelta:
        """The engine-side form (``slick.engine.lora_merge.LoraDelta``)."""
        return parse_peft(self.config, self.tensors, "the trainer's adapter")


def peft_config_dict(config) -> dict:
    """A PEFT ``LoraConfig`` as the JSON dict ``adapter_config.json`` holds (sets as sorted lists)."""
    d = config.to_dict()
    return json.loads(json.dumps(d, default=lambda v: sorted(v) if isinstance(v, (set, frozenset)) else str(v)))


async def accept_adapters(engines: Sequence) -> bool:
    """Whether every engine says it merges or serves an adapter sent alone (``accepts_adapters()``)."""
    async def one(e) -> bool:
        fn = getattr(e, "accepts_adapters", None)
        return bool(await fn()) if fn is not None else False
    return bool(engines) and all(await asyncio.gather(*(one(e) for e in engines)))

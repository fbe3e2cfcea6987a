"""The engine protocol. Rollout code talks only to this; LocalEngine and HttpEngine implement it."""
from __future__ import annotations

from typing import Iterable, Optional, Protocol, runtime_checkable

from slick.types import Generation, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """An async text-generation engine.

    * ``generate`` returns the sampled token ids with the logprob of each under
      softmax(logits / temperature), the finish reason, the weight version when it finished and the weight
      version of every token (``Generation.weight_versions``). ``rid`` names the request (the engine makes one
      when it is None); over HTTP it is SGLang's top-level ``"rid"``.
    * ``abort(rid)`` finishes that one request now: its ``generate`` returns its tokens so far with finish
      reason "abort"; other requests are untouched; an unknown or finished rid is a no-op.
    * ``abort_all`` stops every running and queued request the same way.
    * ``pause_generation`` / ``continue_generation`` (SGLang's "in_place" pause): after pause returns no decode
      step runs until continue; running requests keep their state, queued and new ones wait. Idempotent.
    * ``update_weights`` loads new weights either from ``named_tensors`` (in-process engines) or from
      a Hugging Face safetensors directory ``path``; returns the new weight version. It may run while paused:
      an interruptible update is pause -> update_weights -> continue, and the requests that were in flight go
      on under the new weights (their later tokens carry the new version).
    """

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams,
                       rid: Optional[str] = None) -> Generation: ...

    async def update_weights(self, named_tensors: Optional[Iterable] = None, path: Optional[str] = None,
                             version: Optional[int] = None) -> int: ...

    async def abort(self, rid: str) -> None: ...

    async def abort_all(self) -> None: ...

    async def pause_generation(self) -> None: ...

    async def continue_generation(self) -> None: ...

    async def health(self) -> bool: ...

    async def get_weight_version(self) -> int: ...

    async def close(self) -> None: ...

"""The engine protocol. Rollout code talks only to this; LocalEngine and HttpEngine implement it."""
from __future__ import annotations

from typing import Iterable, Optional, Protocol, runtime_checkable

from slick.types import Generation, SamplingParams


@runtime_checkable
class Engine(Protocol):
    """An async text-generation engine.

    * ``generate`` returns the sampled token ids with the logprob of each under
      softmax(logits / temperature), the finish reason and the weight version that produced them.
    * ``update_weights`` loads new weights either from ``named_tensors`` (in-process engines) or from
      a Hugging Face safetensors directory ``path``; returns the new weight version.
    * ``abort_all`` stops running requests; each returns its partial output with finish reason "abort".
    """

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation: ...

    async def update_weights(self, named_tensors: Optional[Iterable] = None, path: Optional[str] = None,
                             version: Optional[int] = None) -> int: ...

    async def abort_all(self) -> None: ...

    async def health(self) -> bool: ...

    async def get_weight_version(self) -> int: ...

    async def close(self) -> None: ...


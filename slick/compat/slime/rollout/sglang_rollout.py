"""slime's default-rollout helpers that custom generate functions use.

- ``GenerateState(args)``: one per model (``args.hf_checkpoint``), with ``tokenizer`` (the run's own tokenizer
  when slick registered it, else loaded from the local model directory), ``processor`` (None: text only),
  ``sampling_params`` (the rollout's, as an SGLang dict) and ``semaphore``.
- ``generate(args, sample, sampling_params)``: slime's built-in single-turn generate: posts the prompt's token
  ids to ``http://{args.sglang_router_ip}:{args.sglang_router_port}/generate`` and appends the sampled tokens
  with their logprobs.
- ``get_model_url(args, model_name, endpoint)``: the router URL (slick serves one model).
"""
from __future__ import annotations

import asyncio
from typing import Any

from slick.compat.slime.utils.http_utils import post
from slick.compat.slime.utils.types import Sample

_TOKENIZERS: dict[str, Any] = {}     # hf_checkpoint -> tokenizer (slick registers the run's own)
_STATES: dict[str, "GenerateState"] = {}


def register_tokenizer(hf_checkpoint: Any, tokenizer: Any) -> None:
    """Make ``tokenizer`` the one ``GenerateState(args).tokenizer`` gives for ``args.hf_checkpoint``."""
    _TOKENIZERS[str(hf_checkpoint)] = tokenizer
    _STATES.pop(str(hf_checkpoint), None)


def _tokenizer(path: Any) -> Any:
    if str(path) not in _TOKENIZERS:
        from transformers import AutoTokenizer   # noqa: PLC0415 - only when slick did not register one

        _TOKENIZERS[str(path)] = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    return _TOKENIZERS[str(path)]


class GenerateState:
    """Shared per model (a new ``GenerateState(args)`` for the same ``args.hf_checkpoint`` is the same object).
    ``args``: what slick hands a slime generate function (``slick.rollout.slime_generate``): every flag of the run
    plus slime's own defaults (``sglang_server_concurrency``, ...), read as slime reads them."""

    def __new__(cls, args):
        key = str(args.hf_checkpoint)
        if key not in _STATES:
            state = super().__new__(cls)
            state._setup(args)
            _STATES[key] = state
        return _STATES[key]

    def __init__(self, args):
        self.args = args

    def _setup(self, args) -> None:
        self.tokenizer = _tokenizer(args.hf_checkpoint)
        self.processor = None
        self.semaphore = asyncio.Semaphore(int(args.sglang_server_concurrency or 512))
        self.sampling_params = dict(
            temperature=args.rollout_temperature, top_p=args.rollout_top_p,
            top_k=args.rollout_top_k, max_new_tokens=args.rollout_max_response_len,
            stop=list(args.rollout_stop or []) or None,
            stop_token_ids=list(args.rollout_stop_token_ids or []) or None,
            skip_special_tokens=False, no_stop_trim=True, spaces_between_special_tokens=False)
        self.aborted = False


def get_model_url(args, model_name: str = "", endpoint: str = "/generate") -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    """slime's built-in generate (see the module doc)."""
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ValueError(f"generate: sample {sample.index} has status {sample.status.value}")
    state = GenerateState(args)
    ids = list(sample.tokens) if sample.tokens else \
        state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    params = dict(sampling_params)
    params["max_new_tokens"] = int(params.get("max_new_tokens", 128)) - sample.response_length
    if params["max_new_tokens"] <= 0:
        sample.status = Sample.Status.TRUNCATED
        return sample
    out = await post(get_model_url(args), {"input_ids": ids, "sampling_params": params, "return_logprob": True})
    if not sample.tokens:
        sample.tokens = ids
    pairs = out["meta_info"].get("output_token_logprobs") or []
    sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                  trainable=True, meta_info=out["meta_info"], text=out.get("text", ""))
    return sample

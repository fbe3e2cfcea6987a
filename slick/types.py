"""Core data contracts shared by every room: Sample, SamplingParams, Generation.

These are plain dataclasses with lossless JSON round-trips (``to_dict`` / ``from_dict``).
They import nothing heavier than the standard library.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, Union


class Status(str, Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


FINISH_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclass
class SamplingParams:
    """Sampling settings, named as in SGLang's ``sampling_params``.

    ``temperature == 0`` means greedy (below 1e-5 too: ``slick.engine.sampling.GREEDY_BELOW``); engines check
    the settings with ``slick.engine.sampling.validate_sampling``. ``top_k <= 0`` and ``top_p == 1`` disable truncation.
    ``seed`` makes one request's sampling reproducible. ``ignore_eos`` keeps generating past EOS and
    ``stop_token_ids`` (as in SGLang, stop strings still stop) up to ``max_new_tokens``.
    ``skip_special_tokens`` and ``no_stop_trim`` only shape the response text of ``slick serve``.
    ``json_schema`` (a JSON string), ``regex`` and ``ebnf`` (llguidance's Lark syntax, or GBNF) constrain the
    output by grammar (``slick/engine/grammar.py``; SGLang's names); ``top_logprobs_num`` asks for that many
    most likely tokens with their logprobs at every step (``Generation.top_logprobs``).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop: Optional[list[str]] = None
    stop_token_ids: Optional[list[int]] = None
    seed: Optional[int] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    json_schema: Optional[str] = None
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    top_logprobs_num: int = 0

    def to_sglang(self) -> dict:
        d = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
             "max_new_tokens": self.max_new_tokens}
        if self.stop:
            d["stop"] = list(self.stop)
        if self.stop_token_ids:
            d["stop_token_ids"] = list(self.stop_token_ids)
        if self.seed is not None:
            d["sampling_seed"] = self.seed
        for name, default in (("ignore_eos", False), ("skip_special_tokens", True), ("no_stop_trim", False)):
            if getattr(self, name) != default:
                d[name] = getattr(self, name)
        for name in ("json_schema", "regex", "ebnf"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        return d

    @classmethod
    def from_sglang(cls, d: dict) -> "SamplingParams":
        """Build from an SGLang ``sampling_params`` dict; unknown keys are ignored, ``None`` means the default.

        (``slick.serve.http_protocol.parse_sampling`` checks a request's dict before it gets here.)"""
        d = {k: v for k, v in d.items() if v is not None}
        stop = d.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        seed = d.get("sampling_seed", d.get("seed"))
        return cls(
            temperature=float(d.get("temperature", 1.0)),
            top_p=float(d.get("top_p", 1.0)),
            top_k=int(d.get("top_k", -1)),
            max_new_tokens=int(d.get("max_new_tokens", 128)),
            stop=list(stop) if stop else None,
            stop_token_ids=list(d["stop_token_ids"]) if d.get("stop_token_ids") else None,
            seed=int(seed) if seed is not None else None,
            ignore_eos=bool(d.get("ignore_eos", False)),
            skip_special_tokens=bool(d.get("skip_special_tokens", True)),
            no_stop_trim=bool(d.get("no_stop_trim", False)),
            json_schema=d.get("json_schema"), regex=d.get("regex"), ebnf=d.get("ebnf"),
        )


@dataclass
class Generation:
    """What an engine returns for one request.

    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under softmax(logits / temperature)
    (no top-p/top-k truncation; for greedy requests, under the untempered softmax).
    ``finish_reason`` is one of ``"stop"``, ``"length"``, ``"abort"``.
    ``weight_version`` is the engine's weight version when the request finished; ``weight_versions``, when
    the engine reports it, holds one version per token: the weights that sampled it (a request paused,
    updated and continued carries the old version on its first tokens and the new one on the rest).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int = 0
    prompt_tokens: int = 0
    text: Optional[str] = None
    weight_versions: Optional[list[int]] = None
    top_logprobs: Optional[list[list[tuple[int, float]]]] = None   # per token: (id, logprob), most likely first
    # MoE engines that record routing: the experts of every input token (prompt + token_ids[:-1]) as
    # {"shape": [tokens, MoE layers, k], "uint8_b64": ...} (slick.algo.routing.encode_routing; docs/moe.md)
    routed_experts: Optional[dict] = None


@dataclass
class Sample:
    """One prompt/response pair travelling from the DataSource through rollout into training."""

    index: int = 0                      # unique sample id within the run
    group_index: int = 0                # samples of one prompt share a group index
    prompt_index: int = 0               # row of the prompt in its dataset
    epoch: int = 0                      # pass over the dataset the prompt was drawn in
    prompt: Union[str, list[dict]] = ""
    label: Any = None
    metadata: dict = field(default_factory=dict)
    tools: Optional[list] = None
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response: str = ""
    rollout_logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)   # one per response token; 0 = env/tool token
    reward: Union[float, dict, None] = None
    status: Status = Status.PENDING
    weight_versions: list[int] = field(default_factory=list)  # policy version per response token
    timings: dict = field(default_factory=dict)
    # verifier evidence set by the reward hub: reward_type, answer, verdict, error, seconds + extras
    # (slick/reward/evidence.py); JSON-able, so it survives to_dict/from_dict and the debug dumps
    evidence: dict = field(default_factory=dict)
    # MoE rollouts: the experts the engine chose for every input token (prompt + response[:-1]), for routing
    # replay; the latest generation's record (its prompt held the whole context before it); docs/moe.md
    routed_experts: Optional[dict] = None

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        if d["routed_experts"] is None:   # dense models: no key (their records stay as they were)
            del d["routed_experts"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Sample":
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["status"] = Status(kw.get("status", Status.PENDING))
        return cls(**kw)

    def apply_generation(self, gen: Generation) -> None:
        """Append an engine's output to this sample (supports partial/multi-turn continuation).

        ``weight_versions`` grows by ``gen.weight_versions`` (one per token) when the engine reported them,
        else by ``gen.weight_version`` repeated; a length mismatch raises ``ValueError`` before any change."""
        if gen.weight_versions is not None:
            if len(gen.weight_versions) != len(gen.token_ids):
                raise ValueError(f"Generation has {len(gen.weight_versions)} weight_versions for "
                                 f"{len(gen.token_ids)} tokens")
            versions = [int(v) for v in gen.weight_versions]
        else:
            versions = [gen.weight_version] * len(gen.token_ids)
        self.response_ids = list(self.response_ids) + list(gen.token_ids)
        self.rollout_logprobs = list(self.rollout_logprobs) + list(gen.logprobs)
        self.loss_mask = list(self.loss_mask) + [1] * len(gen.token_ids)
        self.weight_versions = list(self.weight_versions) + versions
        self.routed_experts = gen.routed_experts
        self.status = FINISH_TO_STATUS.get(gen.finish_reason, Status.FAILED)


class ClusterFailure(RuntimeError):
    """A run on Ray could not start or went down (cluster too small, an actor died or timed out); the message
    names what was asked and what failed. The CLI drivers print it without a traceback (exit code 1).
    Defined here, below every room, so that code which only checks for it (checkpoint writes) needs no Ray room."""

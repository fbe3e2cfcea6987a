"""slime's ``Sample``: the field names and methods a slime plug-in uses (slime/utils/types.py).

A slime sample keeps the whole sequence in ``tokens`` (prompt, then ``response_length`` response tokens), the
engine's logprobs of the response in ``rollout_log_probs``, one ``loss_mask`` entry per response token (0 for
tool/environment tokens) and its state in ``status`` (``Sample.Status``). slick's rollout converts its own
samples to this shape before a slime plug-in runs and back afterwards (``slick.rollout.slime_generate``).
Fields slick has no use for (multimodal inputs, top-p replay, routed experts, ...) are kept so that plug-ins
may set them; they are not trained on. Standard library only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional, Union


def _ints(xs) -> list[int]:
    xs = xs.tolist() if hasattr(xs, "tolist") else xs
    return [int(x) for x in (xs or [])]


def _floats(xs) -> Optional[list[float]]:
    if xs is None:
        return None
    xs = xs.tolist() if hasattr(xs, "tolist") else xs
    return [float(x) for x in xs]


@dataclass
class Sample:
    """One prompt and its response, in slime's names (see the module doc)."""

    group_index: Optional[int] = None
    index: Optional[int] = None
    rollout_id: Optional[int] = None
    prompt: Union[str, list] = ""
    tokens: list = field(default_factory=list)
    multimodal_inputs: Optional[dict] = None
    multimodal_train_inputs: Optional[dict] = None
    multimodal_train_input_id: Optional[str] = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: Any = None
    loss_mask: Optional[list] = None
    weight_versions: list = field(default_factory=list)
    rollout_log_probs: Optional[list] = None
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
    rollout_routed_experts: Any = None
    remove_sample: bool = False
    teacher_log_probs: Optional[list] = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: "Sample.Status" = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: Optional[str] = None
    custom_rm_path: Optional[str] = None
    train_metadata: Optional[dict] = None
    session_id: Optional[str] = None
    non_generation_time: float = 0.0

    # ------------------------------------------------------------------ slime's helpers
    def get_reward_value(self, args) -> Any:
        """The reward, or its ``args.reward_key`` entry when a key is set (as in slime)."""
        key = args.reward_key
        return self.reward[key] if key else self.reward

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask) if self.loss_mask is not None else self.response_length

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["status"] = self.status.value
        return d

    @staticmethod
    def from_dict(data: dict) -> "Sample":
        data = dict(data)
        data["status"] = Sample.Status(data.get("status", "pending"))
        names = {f.name for f in dataclasses.fields(Sample)}
        s = Sample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(s, k, v)
        return s

    def append_response_tokens(self, args=None, *, tokens=None, log_probs=None, trainable: bool = True,
                               meta_info: Optional[dict] = None, text: Optional[str] = None,
                               update_terminal_info: bool = True, **_ignored) -> None:
        """Add response tokens: sampled ones (``trainable``, with the engine's ``log_probs``) get loss mask 1,
        others (tool results, observations) loss mask 0 and logprob 0.0. ``meta_info`` is an SGLang
        ``/generate`` answer's: its ``weight_version`` is appended and its finish reason sets ``status``."""
        tokens, log_probs = _ints(tokens), _floats(log_probs)
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"append_response_tokens: {len(log_probs)} log_probs for {len(tokens)} tokens")
        if tokens and trainable and log_probs is None:
            raise ValueError("append_response_tokens: trainable tokens need the engine's log_probs "
                             "(post /generate with return_logprob true)")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("append_response_tokens: tokens with trainable=False take no log_probs")
            log_probs = [0.0] * len(tokens)
        if text is not None:
            self.response += text
        before = self.response_length
        if tokens:
            self.tokens = list(self.tokens) + tokens
            self.response_length += len(tokens)
            self.loss_mask = (list(self.loss_mask) if self.loss_mask is not None else [1] * before) + \
                [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError("append_response_tokens: the sample has response tokens but no "
                                     "rollout_log_probs to extend")
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs = list(self.rollout_log_probs) + log_probs
        if meta_info and update_terminal_info and "finish_reason" in meta_info:
            if "weight_version" in meta_info:
                self.weight_versions.append(str(meta_info["weight_version"]))
            kind = (meta_info["finish_reason"] or {}).get("type")
            self.status = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED,
                           "stop": Sample.Status.COMPLETED}.get(kind, self.status)

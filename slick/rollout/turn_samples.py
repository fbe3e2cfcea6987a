"""One training sample per assistant turn, for chat templates that rewrite earlier turns (docs/agents.md).

The built-in multi-turn rollout (:mod:`slick.rollout.multiturn`) is token-exact by concatenation: each turn's
prompt is the previous turn's context + its sampled tokens + the template's token delta of the new messages. A
template that rewrites history (Qwen3's drops the reasoning of earlier turns) has no such delta: the text it
renders for the next turn does not start with the text of the turns before. For such a template the rollout
renders every turn's prompt afresh from the conversation (the template's own rendering of the history, tokenized
whole) and keeps what the policy sampled at that turn exactly as sampled. Each turn is then a *segment*:

* ``prompt_ids``: the tokens the engine was given for that turn (``None`` for the first: ``sample.prompt_ids``);
* ``start``/``end``: the turn's slice of ``sample.response_ids``, where the episode's sampled tokens lie one
  turn after the other with their logprobs, loss mask and weight versions, as the engine returned them;
* ``status`` and ``routed_experts``: the sample's after that turn's generation.

Segments live in ``sample.metadata["multiturn"]["segments"]`` (JSON, so an aborted turn continues exactly). After
the episode is scored, :func:`split_group` turns each segmented episode into one sample per segment: prompt = the
segment's prompt, response = its sampled tokens (never re-tokenized), all sharing the episode's reward and a
session key (``slick.algo.sessions.SESSION_KEY``), so training gives them the episode's one advantage
(``slick.algo.sessions``: the estimator sees the episode's last turn). An episode of one turn stays one sample.

**Which mode.** At start-up :func:`choose_mode` runs ``slick check-template``'s fuzz once per tokenizer
(:func:`slick.chat.template_check.check_template_cached`) and logs its choice: prefix-preserving -> exact
concatenation, as before; rewriting -> one sample per turn. Under exact concatenation a rewrite the fuzz did not
meet (:class:`slick.chat.delta.ChatTemplateRewriteError` at a step) starts a new segment for that episode instead
of stopping the run; it is logged once.

**Budget.** ``--rollout-max-response-len`` bounds each turn's context beyond the first prompt: (its prompt's
length - the first prompt's) + its tokens so far, the same count as ``len(response_ids)`` under concatenation.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import dataclass
from typing import Optional

from slick.algo.sessions import SESSION_KEY   # the training side of split episodes: slick/algo/sessions.py
from slick.chat.template_check import TemplateReport, check_template_cached
from slick.types import Sample, Status

log = logging.getLogger("slick.rollout")

STATE_KEY = "multiturn"      # sample.metadata key of the multi-turn state (slick.rollout.multiturn)
SEGMENTS = "segments"        # its list of segments, when the episode has more than one
CHECK_CASES = 32             # conversations the start-up check fuzzes
_LOGGED: set = set()


@dataclass(frozen=True)
class TurnMode:
    """``per_turn``: one training sample per assistant turn (the template rewrites earlier turns)."""

    per_turn: bool
    report: TemplateReport

    def describe(self) -> str:
        r = self.report
        if self.per_turn:
            return (f"the chat template rewrites earlier turns ({len(r.rewrites)} of {len(r.rendered)} fuzzed "
                    f"conversations; first: {r.first_rewrite.describe()}): multi-turn episodes become one training "
                    "sample per assistant turn, sharing the episode's reward and advantage")
        return (f"the chat template preserves prefixes ({len(r.rendered)} fuzzed conversations): multi-turn "
                "episodes concatenate their turns' tokens exactly, one training sample each")


def choose_mode(tokenizer) -> TurnMode:
    """Exact concatenation or one sample per turn for ``tokenizer``'s chat template (checked once per tokenizer
    path and template; the choice is logged once)."""
    report = check_template_cached(tokenizer, cases=CHECK_CASES)
    mode = TurnMode(per_turn=not report.prefix_preserving, report=report)
    key = (str(getattr(tokenizer, "name_or_path", "")), repr(getattr(tokenizer, "chat_template", None)))
    if key not in _LOGGED:
        _LOGGED.add(key)
        log.info("multi-turn rollout: %s", mode.describe())
    return mode


# ----------------------------------------------------------------------------------------------- during the rollout
def _current(st: dict) -> Optional[dict]:
    segs = st.get(SEGMENTS)
    return segs[-1] if segs else None


def context_ids(sample: Sample, st: dict) -> list[int]:
    """What the engine continues for the current turn: the segment's prompt + its tokens so far."""
    seg = _current(st)
    if seg is None:
        return list(sample.prompt_ids) + list(sample.response_ids)
    return list(seg["prompt_ids"]) + list(sample.response_ids[seg["start"]:])


def used(sample: Sample, st: dict) -> int:
    """The current turn's context beyond the first prompt (``len(response_ids)`` without segments)."""
    seg = _current(st)
    if seg is None:
        return len(sample.response_ids)
    return len(seg["prompt_ids"]) - len(sample.prompt_ids) + len(sample.response_ids) - seg["start"]


def start_segment(sample: Sample, st: dict, prompt_ids: list[int]) -> None:
    """Close the current segment (its end, status and routing record) and open one with ``prompt_ids``."""
    segs = st.setdefault(SEGMENTS, [{"prompt_ids": None, "start": 0}])
    segs[-1].update(end=len(sample.response_ids), status=sample.status.value)
    if sample.routed_experts is not None:
        segs[-1]["routed_experts"] = sample.routed_experts
    segs.append({"prompt_ids": [int(t) for t in prompt_ids], "start": len(sample.response_ids)})


# ----------------------------------------------------------------------------------------------- after scoring
def split_sample(sample: Sample, tokenizer) -> list[Sample]:
    """One sample per non-empty segment of a segmented episode (``[sample]`` when it has no segments)."""
    st = sample.metadata.get(STATE_KEY)
    segs = st.get(SEGMENTS) if isinstance(st, dict) else None
    if not segs:
        return [sample]
    pieces = []
    for i, seg in enumerate(segs):
        last = i == len(segs) - 1
        end = len(sample.response_ids) if last or seg.get("end") is None else seg["end"]
        if end > seg["start"]:
            pieces.append((seg, end, last))
    if not pieces:
        return [sample]
    state = {k: v for k, v in st.items() if k != SEGMENTS}
    sid = f"episode-{sample.index}"
    out = []
    for k, (seg, end, last) in enumerate(pieces):
        a = seg["start"]
        meta = copy.deepcopy({**sample.metadata, STATE_KEY: state})
        meta[SESSION_KEY] = {"id": sid, "kind": "turns", "turn": k, "samples": len(pieces)}
        ids = list(sample.response_ids[a:end])
        out.append(dataclasses.replace(
            sample, metadata=meta,
            prompt_ids=list(sample.prompt_ids) if seg["prompt_ids"] is None else list(seg["prompt_ids"]),
            response_ids=ids, rollout_logprobs=list(sample.rollout_logprobs[a:end]),
            loss_mask=list(sample.loss_mask[a:end]), weight_versions=list(sample.weight_versions[a:end]),
            response=tokenizer.decode(ids, skip_special_tokens=True),
            status=sample.status if last else Status(seg.get("status", sample.status.value)),
            routed_experts=sample.routed_experts if last else seg.get("routed_experts"),
            reward=copy.deepcopy(sample.reward), evidence=copy.deepcopy(sample.evidence),
            timings=dict(sample.timings)))
    return out


def split_group(group: list[Sample], tokenizer) -> list[Sample]:
    """``group`` with every segmented episode replaced by its per-turn samples, in order (the same list object
    when no episode is segmented)."""
    if not any(isinstance(s.metadata.get(STATE_KEY), dict) and s.metadata[STATE_KEY].get(SEGMENTS) for s in group):
        return group
    return [x for s in group for x in split_sample(s, tokenizer)]


def episodes(samples) -> tuple[int, int]:
    """(episodes, training samples) among ``samples``: per-turn samples of one episode count once."""
    ids, n = set(), 0
    for i, s in enumerate(samples):
        info = s.metadata.get(SESSION_KEY) or {}
        ids.add(info["id"] if info.get("kind") == "turns" else f"sample-{i}")
        n += 1
    return len(ids), n


def is_episode_head(sample: Sample) -> bool:
    """Whether ``sample`` stands for its episode in per-episode metrics (its last turn, or an unsplit sample)."""
    info = sample.metadata.get(SESSION_KEY) or {}
    return info.get("kind") != "turns" or info.get("turn") == info.get("samples", 0) - 1

"""Multi-turn rollouts under a chat template that rewrites earlier turns: one training sample per assistant turn.

A Qwen3-style thinking template (tests/chat_templates.py) on SmolLM2's tokenizer. The start-up check finds the
rewrite and the rollout renders every turn's prompt afresh; each turn becomes a sample whose response is exactly
what the engine sampled (never re-tokenized), sharing the episode's reward and session key, and training gives
the episode one advantage. Against the real LocalEngine and Trainer (tiny random model), and against a scripted
engine whose turns think (<think>...</think>) in character-sized tokens no tokenizer would produce.
"""
import asyncio
import logging

import pytest

from slick.algo.assemble import Advantages
from slick.algo.sessions import SESSION_KEY, session_heads, split_sessions
from slick.chat.delta import encode, render
from slick.data.source import DataSource
from slick.reward.hub import RewardHub
from slick.rollout import turn_samples
from slick.rollout.manager import RolloutManager
from slick.rollout.multiturn import MultiTurnRollout, final_answer
from slick.rollout.tools import ToolSet, load_tools
from slick.types import Generation, Sample, SamplingParams, Status
from tests.chat_templates import QWEN3_THINKING, tokenizer_with
from tests.test_multiturn import LOGPROB_TOL, engine, make_cfg, rollout, rows_for, trainer  # noqa: F401 - fixtures


def episode_reward(args, sample):
    """A different reward for every episode (scored once, before its turns are split)."""
    return float(sample.index)


def sessions_of(samples):
    out = {}
    for s in samples:
        out.setdefault(s.metadata[SESSION_KEY]["id"], []).append(s)
    return out


def assistant_positions(messages):
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


def test_rewriting_template_one_sample_per_turn(tiny_model_dir, engine, trainer, caplog, monkeypatch):  # noqa: F811
    tok = tokenizer_with(QWEN3_THINKING)
    cfg = make_cfg(tiny_model_dir, max_turns=3, max_tokens_per_turn=6, tool_path="tests.agent_tools:GOOD",
                   tool_parser="tests.test_multiturn:two_calls",
                   custom_rm_path="tests.test_multiturn_per_turn:episode_reward")
    monkeypatch.setattr(turn_samples, "_LOGGED", set())
    with caplog.at_level(logging.INFO, logger="slick.rollout"):
        assert MultiTurnRollout(cfg, tok).per_turn
    assert "the chat template rewrites earlier turns" in caplog.text and "one training sample per assistant turn" \
        in caplog.text
    schemas = ToolSet(load_tools(cfg.tool_path)).schemas()
    samples, metrics, calls = rollout(cfg, tok, engine, tools=schemas)
    assert len(calls) == 12 and len(samples) == 12              # 4 episodes x 3 turns, one sample per turn
    # token-exact: each sample is one engine call, its prompt the call's input, its response the sampled tokens
    for s in samples:
        matches = [g for inp, g, _ in calls if inp == list(s.prompt_ids) and list(g.token_ids) == list(s.response_ids)]
        assert len(matches) == 1
        g = matches[0]
        assert s.rollout_logprobs == list(g.logprobs) and s.loss_mask == [1] * len(g.token_ids)
        assert len(s.weight_versions) == len(s.response_ids)
    assert sorted(len(s.prompt_ids) for s in samples) == sorted(len(inp) for inp, _, _ in calls)
    episodes = sessions_of(samples)
    assert len(episodes) == 4
    for sid, turns in episodes.items():
        assert [t.metadata[SESSION_KEY]["turn"] for t in turns] == [0, 1, 2]
        assert len({t.reward for t in turns}) == 1 and len({t.group_index for t in turns}) == 1
        st = turns[-1].metadata["multiturn"]
        assert st["turns"] == 3 and "segments" not in st and final_answer(turns[-1]) == st["messages"][-1]["content"]
        # each turn's prompt is the template's own rendering of the conversation before that turn
        for t, pos in zip(turns, assistant_positions(st["messages"])):
            assert list(t.prompt_ids) == encode(tok, render(tok, st["messages"][:pos], schemas, True))
    assert len({t[0].reward for t in episodes.values()}) == 4
    assert metrics["rollout/turns/mean"] == 3.0 and metrics["rollout/turn_samples/mean"] == 3.0
    assert metrics["rollout/tool_calls/mean"] == 4.0
    # the trainer recomputes the engine's logprobs on these tokens
    lps = trainer.compute_logprobs(samples)
    worst = max(abs(float(lp[i]) - s.rollout_logprobs[i]) for s, lp in zip(samples, lps) for i in range(len(lp)))
    assert worst < LOGPROB_TOL, worst
    # one advantage per episode: GRPO on each episode's last turn, spread over its turns
    sessions = split_sessions(samples)
    assert [len(v) for v in sessions] == [3, 3, 3, 3]
    assert [samples[h].group_index for h in session_heads(sessions)] == [0, 0, 1, 1]
    adv = Advantages.from_config(cfg).compute(samples, [s.reward for s in samples])
    for members in sessions:
        values = {round(float(adv[i][0]), 6) for i in members}
        assert len(values) == 1 and values != {0.0}


class CountdownUserEnv:
    """Two steps, observations as user turns (Qwen3's template drops earlier reasoning at each), reward 1.0 each."""

    def __init__(self, args, sample):
        self.steps = 0

    async def step(self, policy_message):
        self.steps += 1
        return f"step {self.steps}: go on", 1.0, self.steps >= 2


class ThinkingEngine:
    """Answers every turn with a thinking turn spelled one character per token (not how SmolLM2's tokenizer splits
    that text), then the stop token; ``abort_at`` (call index) cuts that call after 3 tokens with an abort."""

    def __init__(self, tok, abort_at=None):
        self.tok, self.abort_at, self.calls, self.turn, self.rest = tok, abort_at, [], 0, None

    def tokens(self, n):
        text = f"<think>\nhmm {n}\n</think>\n\nanswer {n}"
        return [i for c in text for i in self.tok(c, add_special_tokens=False)["input_ids"]] + [self.tok.eos_token_id]

    async def generate(self, prompt_ids, sampling, rid=None):
        self.calls.append(list(prompt_ids))
        if self.rest is not None:      # the continuation of an aborted turn
            ids, self.rest = self.rest, None
        else:
            ids = self.tokens(self.turn)
            if len(self.calls) - 1 == self.abort_at:
                self.rest = ids[3:]
                return Generation(ids[:3], [-0.5] * 3, "abort", 7)
        self.turn += 1
        return Generation(ids, [-0.25 - 0.001 * i for i in range(len(ids))], "stop", 7)

    async def abort_all(self):
        pass


def scripted_rollout(cfg, tok, eng, exact_mode=False):
    manager = RolloutManager(cfg, DataSource(rows_for(tok), cfg.n_samples_per_prompt), eng, RewardHub(cfg), tok)
    if exact_mode:   # as if the start-up check had not met the rewrite: the first delta raises at the step
        manager.multiturn.per_turn = False
    groups, metrics = asyncio.run(manager.generate_rollout(0))
    return [s for g in groups for s in g], metrics


def test_thinking_turns_keep_their_tokens_and_lose_their_reasoning_in_later_prompts(tiny_model_dir, caplog):
    tok = tokenizer_with(QWEN3_THINKING)
    cfg = make_cfg(tiny_model_dir, max_turns=4, rollout_batch_size=1, n_samples_per_prompt=1,
                   environment_path="tests.test_multiturn_per_turn:CountdownUserEnv")
    for exact_mode in (False, True):
        eng = ThinkingEngine(tok)
        with caplog.at_level(logging.WARNING, logger="slick.rollout"):
            samples, metrics = scripted_rollout(cfg, tok, eng, exact_mode)
        assert len(samples) == 2 and len(eng.calls) == 2
        first, second = samples
        assert [list(first.prompt_ids), list(second.prompt_ids)] == eng.calls
        for n, s in enumerate(samples):   # exactly the scripted tokens, which re-tokenizing would change
            assert list(s.response_ids) == eng.tokens(n) != encode(tok, tok.decode(eng.tokens(n)))
            assert s.loss_mask == [1] * len(s.response_ids) and s.reward == 2.0
        later = tok.decode(second.prompt_ids, skip_special_tokens=False)
        assert "answer 0<|im_end|>\n<|im_start|>user\nstep 1: go on" in later and "hmm 0" not in later
        assert list(second.prompt_ids[:len(first.prompt_ids) + len(first.response_ids)]) != \
            list(first.prompt_ids) + list(first.response_ids)    # not a continuation: the history was rewritten
        assert metrics["rollout/turn_samples/mean"] == 2.0
        assert ("this episode's next turn becomes a training sample of its own" in caplog.text) == exact_mode


def test_aborted_turn_continues_its_own_prompt(tiny_model_dir):
    """An abort inside turn 2 keeps the turn's prompt in the JSON state; the continued turn extends it exactly."""
    tok = tokenizer_with(QWEN3_THINKING)
    cfg = make_cfg(tiny_model_dir, max_turns=4, environment_path="tests.test_multiturn_per_turn:CountdownUserEnv")
    mt = MultiTurnRollout.from_config(cfg, tok)
    row = rows_for(tok)[0]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=300, stop_token_ids=[tok.eos_token_id])
    eng = ThinkingEngine(tok, abort_at=1)

    async def go():
        s = await mt.generate(cfg, Sample(index=3, prompt=row["prompt"], prompt_ids=row["prompt_ids"]), sampling, eng)
        assert s.status == Status.ABORTED and len(s.metadata["multiturn"]["segments"]) == 2
        s = Sample.from_dict(s.to_dict())
        return await mt.generate(cfg, s, sampling, eng)

    s = asyncio.run(go())
    assert s.status == Status.COMPLETED and len(eng.calls) == 3
    assert eng.calls[2] == eng.calls[1] + eng.tokens(1)[:3]            # continued, not restarted
    s.reward = 1.0
    first, second = turn_samples.split_sample(s, tok)
    assert list(second.prompt_ids) == eng.calls[1] and list(second.response_ids) == eng.tokens(1)
    assert second.rollout_logprobs[:3] == [-0.5] * 3 and second.status == Status.COMPLETED
    assert list(first.response_ids) == eng.tokens(0) and first.reward == second.reward == 1.0
    assert first.metadata[SESSION_KEY] == {"id": "episode-3", "kind": "turns", "turn": 0, "samples": 2}


def test_per_turn_samples_need_an_outcome_level_estimator(tiny_model_dir):
    """Refused at start-up, naming the template's rewrite and the flags, not at the first training step."""
    cfg = make_cfg(tiny_model_dir, max_turns=2, environment_path="tests.test_multiturn_per_turn:CountdownUserEnv",
                   advantage_estimator="reinforce_plus_plus")
    with pytest.raises(ValueError, match=r"rewrites earlier turns .*case 0, turn 2.*one advantage per session needs "
                                         r"--advantage-estimator grpo/gspo/rloo/reinforce_plus_plus_baseline"):
        MultiTurnRollout(cfg, tokenizer_with(QWEN3_THINKING))
    assert not MultiTurnRollout(cfg, tokenizer_with(None)).per_turn   # a prefix-preserving template: any estimator

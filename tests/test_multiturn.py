"""Built-in multi-turn rollout against a real LocalEngine (tiny random model) and the real Trainer.

The tiny random model does not write tool calls by itself, so the tests plug in a tool-call parser (by dotted
path, as users can) that calls tools after every turn; everything else (engine, chat-template deltas, tools,
the rollout manager, packing, the trainer's logprobs) is the code users run.
"""
import asyncio
import dataclasses

import pytest

from slick.config import Config
from slick.configure.validate import validate_config
from slick.data.source import DataSource
from slick.engine.local import LocalEngine
from slick.reward.hub import RewardHub
from slick.chat.delta import ChatDelta
from slick.rollout.manager import RolloutManager
from slick.rollout.multiturn import MultiTurnRollout, append_env_tokens, final_answer, get_tokenizer
from slick.rollout.tools import ToolSet, load_tools
from slick.train.packing import pack
from slick.train.trainer import Trainer
from slick.types import Sample, SamplingParams, Status
from tests.chat_templates import LLAMA3_STYLE, QWEN_STYLE, tokenizer_with

LOGPROB_TOL = 1e-3  # engine (fp32 KV-cache decode) vs trainer (fp32 packed forward), same weights


# ------------------------------------------------------------------ plug-ins used by the tests (dotted paths)
def two_calls(text):
    """After every turn: two calls, so consecutive tool messages follow each turn."""
    return [{"name": "add", "arguments": {"a": len(text), "b": 1}}, {"name": "echo", "arguments": {"text": "ok"}}]


def bad_calls(text):
    return [{"name": n, "arguments": {}} for n in ("boom", "hang_async", "big", "crash", "print_big")]


async def feedback_generate(args, sample, sampling_params, engine):
    """The custom generate of docs/agents.md, verbatim."""
    tok = get_tokenizer(args)
    msgs = sample.prompt if isinstance(sample.prompt, list) else [{"role": "user", "content": sample.prompt}]
    conv = ChatDelta(tok, msgs, prompt_text=tok.decode(sample.prompt_ids, skip_special_tokens=False))
    per_turn = dataclasses.replace(sampling_params, max_new_tokens=32)
    for turn in range(args.max_turns):
        start = len(sample.response_ids)
        gen = await engine.generate(sample.prompt_ids + sample.response_ids, per_turn)
        sample.apply_generation(gen)
        text = conv.add_policy_turn(sample.response_ids[start:])
        if gen.finish_reason == "abort" or "DONE" in text or turn == args.max_turns - 1:
            break
        append_env_tokens(sample, conv.append([{"role": "user", "content": f"feedback on {len(text)} chars"}]))
    sample.response = tok.decode(sample.response_ids, skip_special_tokens=True)
    return sample


class CountdownEnv:
    """Two steps: an observation, then done; reward 1.0 per step (async step)."""

    def __init__(self, args, sample):
        self.steps, self.closed = 0, False

    def reset(self, sample):
        return None

    async def step(self, policy_message):
        self.steps += 1
        return f"step {self.steps} saw {len(policy_message)} characters", 1.0, self.steps >= 2


class RulesEnv(CountdownEnv):
    """reset adds a message to the prompt; observations come back as tool messages (sync step)."""

    observation_role = "tool"

    def reset(self, sample):
        return "Rules: answer in one word."

    def step(self, policy_message):
        self.steps += 1
        return "try again", None, self.steps >= 2


# ------------------------------------------------------------------ fixtures
class Recorder:
    """Passes every call to the real engine and keeps (input ids, Generation) of each."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, rid=None):
        gen = await self.engine.generate(prompt_ids, sampling, rid=rid)
        self.calls.append((list(prompt_ids), gen, sampling))
        return gen


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=8, seed=0)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    return Trainer(make_cfg(tiny_model_dir))


def make_cfg(model_dir, **kw):
    base = dict(hf_checkpoint=str(model_dir), dtype="fp32", device="cpu", micro_batch_size=4, seed=7,
                rollout_temperature=1.0, rollout_batch_size=2, n_samples_per_prompt=2, rm_type=None,
                custom_rm_path="slick.rollout.env.env_reward", rollout_max_response_len=300)
    base.update(kw)
    cfg = Config.from_flat(base)
    return validate_config(cfg, check_files=False) or cfg


def rows_for(tok, tools=None):
    prompts = ["What is 12 + 30?", "Add 7 and 5, please."]
    out = []
    for i, p in enumerate(prompts):
        msgs = [{"role": "user", "content": p}]
        text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
        out.append({"prompt_index": i, "prompt": msgs, "tools": tools, "label": None, "metadata": {},
                    "prompt_ids": tok(text, add_special_tokens=False)["input_ids"]})
    return out


def rollout(cfg, tok, engine, tools=None):
    rec = Recorder(engine)
    manager = RolloutManager(cfg, DataSource(rows_for(tok, tools), cfg.n_samples_per_prompt), rec,
                             RewardHub(cfg), tok)
    groups, metrics = asyncio.run(manager.generate_rollout(0))
    return [s for g in groups for s in g], metrics, rec.calls


def runs(mask, value):
    """[(start, end)] of the maximal runs of ``value`` in ``mask``."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [None]):
        if m == value and start is None:
            start = i
        elif m != value and start is not None:
            out.append((start, i))
            start = None
    return out


def check_exact(samples, calls, trainer):
    """Every engine call saw exactly prompt + response so far; policy tokens are kept as sampled, with their
    logprobs; the trainer receives these tokens and recomputes the same logprobs."""
    for s in samples:
        full = list(s.prompt_ids) + list(s.response_ids)
        mine = [(inp, g) for inp, g, _ in calls if full[:len(inp) + len(g.token_ids)] == inp + list(g.token_ids)
                and len(inp) >= len(s.prompt_ids)]
        assert len(mine) == s.metadata["multiturn"]["turns"]
        sampled = 0
        for inp, g in mine:
            start = len(inp) - len(s.prompt_ids)
            seg = slice(start, start + len(g.token_ids))
            assert s.loss_mask[seg] == [1] * len(g.token_ids)
            assert s.rollout_logprobs[seg] == list(g.logprobs)
            sampled += len(g.token_ids)
        assert sum(s.loss_mask) == sampled
        assert len(s.loss_mask) == len(s.rollout_logprobs) == len(s.weight_versions) == len(s.response_ids)
    packed = pack(samples, list(range(len(samples))))
    expect_ids = [t for s in samples for t in list(s.prompt_ids) + list(s.response_ids)[:-1]]
    assert packed.input_ids[0].tolist() == expect_ids
    assert packed.targets.tolist() == [t for s in samples for t in s.response_ids]
    lps = trainer.compute_logprobs(samples)
    worst = 0.0
    for s, lp in zip(samples, lps):
        for i, m in enumerate(s.loss_mask):
            if m:
                worst = max(worst, abs(float(lp[i]) - s.rollout_logprobs[i]))
    assert worst < LOGPROB_TOL, worst


# ------------------------------------------------------------------ tests
@pytest.mark.parametrize("name,template", [("smollm2", None), ("llama3", LLAMA3_STYLE), ("qwen", QWEN_STYLE)])
def test_golden_trajectory(name, template, tiny_model_dir, engine, trainer):
    tok = tokenizer_with(template)
    cfg = make_cfg(tiny_model_dir, max_turns=3, max_tokens_per_turn=6, tool_path="tests.agent_tools:GOOD",
                   tool_parser="tests.test_multiturn:two_calls")
    schemas = ToolSet(load_tools(cfg.tool_path)).schemas()
    samples, metrics, calls = rollout(cfg, tok, engine, tools=schemas if name == "qwen" else None)
    assert len(samples) == 4 and len(calls) == 12          # 4 samples x 3 turns
    check_exact(samples, calls, trainer)
    for s in samples:
        st = s.metadata["multiturn"]
        assert (st["turns"], st["tool_calls"], st["tool_errors"]) == (3, 4, 0)
        assert all(len(g.token_ids) <= 6 for _, g, _ in calls)
        tool_msgs = [m for m in st["messages"] if m["role"] == "tool"]
        assert [m["content"] for m in tool_msgs][1::2] == ["ok", "ok"]
        # each mask-0 run holds the two tool results of its step, in order
        zero_runs = runs(s.loss_mask, 0)
        assert len(zero_runs) == 2
        for k, (a, b) in enumerate(zero_runs):
            text = tok.decode(s.response_ids[a:b], skip_special_tokens=False)
            first, second = tool_msgs[2 * k]["content"], tool_msgs[2 * k + 1]["content"]
            assert first in text and second in text and text.index(first) < text.rindex(second)
            if name == "qwen":
                assert text.count("<tool_response>") == 2 and text.count("<|im_start|>user") == 1
        assert final_answer(s) == st["messages"][-1]["content"]
        assert s.reward == 0.0
    assert metrics["rollout/turns/mean"] == 3.0
    assert metrics["rollout/tool_calls/mean"] == 4.0
    assert metrics["rollout/tool_errors"] == 0
    assert metrics["rollout/tool_time"] > 0.0
    # tokens the policy sampled, not the tool results' (they counted too: 113 for 57 sampled)
    assert metrics["rollout/generated_tokens"] == sum(sum(s.loss_mask) for s in samples) < \
        sum(len(s.response_ids) for s in samples)
    assert metrics["rollout/generated_tokens"] == sum(len(g.token_ids) for _, g, _ in calls)   # what the engine sampled
    if name != "qwen":  # no tools in this template: the schemas went into the system prompt
        assert '"name": "add"' in tok.decode(samples[0].prompt_ids)


def test_tool_failures_do_not_stop_the_rollout(tiny_model_dir, engine):
    tok = tokenizer_with(None)
    cfg = make_cfg(tiny_model_dir, max_turns=2, max_tokens_per_turn=4, tool_path="tests.agent_tools",
                   tool_parser="tests.test_multiturn:bad_calls", tool_max_output_chars=200, tool_timeout=60.0,
                   rollout_max_response_len=1000, rollout_batch_size=1)
    samples, metrics, _ = rollout(cfg, tok, engine)
    assert len(samples) == 2
    assert metrics["rollout/tool_errors"] == 3 * 2              # boom, hang_async, crash in each sample
    assert metrics["rollout/tool_calls/mean"] == 5.0
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.metadata["multiturn"]["turns"] == 2
        contents = [m["content"] for m in s.metadata["multiturn"]["messages"] if m["role"] == "tool"]
        assert contents[0] == "Error: tool 'boom' raised RuntimeError: tool exploded on 0"
        assert contents[1] == "Error: tool 'hang_async' timed out after 0.3 s"
        assert contents[2] == "x" * 200 + f"\n...[truncated {(1 << 20) - 200} characters]"
        assert contents[3].startswith("Error: tool 'crash' crashed (its process exited with code 3")
        assert contents[4].startswith("y" * 200 + "\n...[truncated ")
        assert "Error: tool 'boom'" in tok.decode(s.response_ids)


def test_budget_counts_tool_tokens(tiny_model_dir, engine):
    tok = tokenizer_with(None)
    cfg = make_cfg(tiny_model_dir, max_turns=10, max_tokens_per_turn=5, tool_path="tests.agent_tools:GOOD",
                   tool_parser="tests.test_multiturn:two_calls", rollout_max_response_len=40)
    samples, metrics, _ = rollout(cfg, tok, engine)
    for s in samples:
        assert len(s.response_ids) <= 40
        assert s.status == Status.TRUNCATED
        assert s.metadata["multiturn"]["turns"] < 10
        assert 0 in s.loss_mask


def test_environment(tiny_model_dir, engine, trainer):
    tok = tokenizer_with(None)
    cfg = make_cfg(tiny_model_dir, max_turns=5, max_tokens_per_turn=5,
                   environment_path="tests.test_multiturn:CountdownEnv")
    samples, metrics, calls = rollout(cfg, tok, engine)
    check_exact(samples, calls, trainer)
    for s in samples:
        st = s.metadata["multiturn"]
        assert st["turns"] == 2 and st["env_reward"] == 2.0 and s.reward == 2.0
        obs = [m for m in st["messages"] if m["role"] == "user"][-1]["content"]
        assert obs.startswith("step 1 saw ")
        (a, b), = runs(s.loss_mask, 0)
        assert obs in tok.decode(s.response_ids[a:b])
    assert metrics["rollout/turns/mean"] == 2.0 and metrics["rollout/tool_calls/mean"] == 0.0


def test_aborted_turn_continues_exactly(tiny_model_dir, engine, trainer):
    """An abort in the middle of the second turn returns the sample ABORTED; after a JSON round trip the same
    sample continues that turn and the finished trajectory is exact."""
    tok = tokenizer_with(None)
    cfg = make_cfg(tiny_model_dir, max_turns=3, max_tokens_per_turn=6, tool_path="tests.agent_tools:GOOD",
                   tool_parser="tests.test_multiturn:two_calls")
    mt = MultiTurnRollout.from_config(cfg, tok)
    row = rows_for(tok)[0]
    sample = Sample(index=0, prompt=row["prompt"], prompt_ids=row["prompt_ids"])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=300, stop_token_ids=[tok.eos_token_id], seed=5)

    class AbortSecond(Recorder):
        async def generate(self, prompt_ids, sampling, rid=None):
            if len(self.calls) != 1:
                return await super().generate(prompt_ids, sampling, rid)
            await self.engine.pause_generation()        # the request queues behind the pause ...
            task = asyncio.ensure_future(self.engine.generate(prompt_ids, sampling))
            await asyncio.sleep(0.05)
            await self.engine.abort_all()               # ... and is aborted there, before any token
            await self.engine.continue_generation()
            gen = await asyncio.wait_for(task, 30)
            self.calls.append((list(prompt_ids), gen, sampling))
            return gen

    async def go():
        rec = AbortSecond(engine)
        s = await mt.generate(cfg, sample, sampling, rec)
        assert s.status == Status.ABORTED and s.metadata["multiturn"]["turns"] == 2
        s = Sample.from_dict(s.to_dict())
        s = await mt.generate(cfg, s, sampling, rec)
        return s, rec.calls

    s, calls = asyncio.run(go())
    assert s.status != Status.ABORTED and s.metadata["multiturn"]["turns"] == 3
    check_exact([s], [c for c in calls if c[1].token_ids], trainer)


def test_custom_generate_helpers(tiny_model_dir):
    cfg = make_cfg(tiny_model_dir)
    tok = get_tokenizer(cfg)
    assert tok.eos_token == "<|im_end|>"
    s = Sample(response_ids=[5, 6], loss_mask=[1, 1], rollout_logprobs=[-0.1, -0.2], weight_versions=[3, 4])
    append_env_tokens(s, [7, 8, 9])
    assert (s.response_ids, s.loss_mask, s.rollout_logprobs, s.weight_versions) == (
        [5, 6, 7, 8, 9], [1, 1, 0, 0, 0], [-0.1, -0.2, 0.0, 0.0, 0.0], [3, 4, 4, 4, 4])


@pytest.mark.parametrize("kw,msg", [
    (dict(max_turns=3), "--max-turns 3 needs --tool-path or --environment-path"),
    (dict(tool_path="tests.agent_tools"), "--tool-path needs --max-turns >= 2"),
    (dict(max_turns=2, environment_path="tests.test_multiturn:CountdownEnv",
          custom_generate_function_path="x.y"), "--custom-generate-function-path replaces the built-in multi-turn"),
    (dict(max_turns=2, tool_path="tests.agent_tools", tool_timeout=0), "--tool-timeout must be > 0 seconds"),
    (dict(max_turns=2, tool_path="tests.agent_tools", max_tokens_per_turn=0), "--max-tokens-per-turn must be >= 1"),
    (dict(max_turns=2, tool_path="tests.no_tools"), "--tool-path 'tests.no_tools': module 'tests.no_tools' not found"),
    (dict(max_turns=2, tool_path="tests.agent_tools", tool_parser="tests.agent_tools:nope"),
     "--tool-parser 'tests.agent_tools:nope': 'tests.agent_tools' has no function 'nope'"),
    (dict(max_turns=2, environment_path="tests.test_multiturn:NoEnv"),
     "--environment-path 'tests.test_multiturn:NoEnv': 'tests.test_multiturn' has no function 'NoEnv'"),
])
def test_agent_flags_refused(kw, msg):
    from slick.config.config import ConfigError

    with pytest.raises(ConfigError, match=msg):
        validate_config(Config.from_flat(dict(rm_type="exact", **kw)), check_files=False)
    # a custom generate may read --max-turns itself
    validate_config(Config.from_flat(dict(rm_type="exact", max_turns=4, custom_generate_function_path="x.y")),
                    check_files=False)


def test_custom_generate_from_the_docs(tiny_model_dir, engine, trainer):
    """A custom generate built from the documented helpers is token-exact too (3 turns each)."""
    tok = tokenizer_with(None)
    cfg = make_cfg(tiny_model_dir, max_turns=3, custom_generate_function_path="tests.test_multiturn:feedback_generate")
    samples, metrics, calls = rollout(cfg, tok, engine)
    for s in samples:
        s.metadata["multiturn"] = {"turns": len(runs(s.loss_mask, 1))}
        assert s.metadata["multiturn"]["turns"] == 3 and len(runs(s.loss_mask, 0)) == 2
        (a, b) = runs(s.loss_mask, 0)[0]
        assert "<|im_start|>user\nfeedback on " in tok.decode(s.response_ids[a:b], skip_special_tokens=False)
    check_exact(samples, calls, trainer)


def test_environment_reset_messages_and_observation_role(tiny_model_dir, engine, trainer):
    tok = tokenizer_with(None)
    cfg = make_cfg(tiny_model_dir, max_turns=5, max_tokens_per_turn=4, rollout_batch_size=1,
                   environment_path="tests.test_multiturn:RulesEnv")
    samples, metrics, calls = rollout(cfg, tok, engine)
    check_exact(samples, calls, trainer)
    for s in samples:
        st = s.metadata["multiturn"]
        assert tok.decode(s.prompt_ids).endswith("user\nRules: answer in one word.<|im_end|>\n<|im_start|>assistant\n")
        assert [m["role"] for m in st["messages"]] == ["user", "user", "assistant", "tool", "assistant"]
        assert st["env_reward"] is None and s.reward == 0.0
        (a, b), = runs(s.loss_mask, 0)
        assert "<|im_start|>tool\ntry again<|im_end|>" in tok.decode(s.response_ids[a:b], skip_special_tokens=False)

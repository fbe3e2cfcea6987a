"""--agent-function-path: black-box agents drive a real OpenAI client against slick's per-session endpoint; every
call is recorded with the engine's exact tokens and becomes the documented training samples."""
import asyncio
import json
import sys
import textwrap

import pytest

from slick.config import Config
from slick.configure.validate import validate_config
from slick.engine.local import LocalEngine
from slick.serve.openai_protocol import Call, Choice
from slick.reward import RewardHub
from slick.rollout.agent import AgentRollout, call_tree, trajectory_samples
from slick.rollout.manager import sampling_from_config, seeded
from slick.types import Sample, Status

pytestmark = pytest.mark.timeout(300)

AGENTS = textwrap.dedent('''
    import openai

    FINAL = {}      # sample index -> content of the last answer the agent received

    def _client(base_url):
        return openai.AsyncOpenAI(base_url=base_url, api_key="slick", max_retries=0, timeout=120)

    def _assistant(msg):
        d = {"role": "assistant", "content": msg.content}
        if msg.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in msg.tool_calls]
        return d

    async def three_calls(args, sample, base_url):
        """user -> answer -> tool result -> answer -> two tool results -> answer; returns None (reward scores)."""
        async with _client(base_url) as c:
            msgs = [{"role": "user", "content": sample.prompt}]
            for turn in range(3):
                r = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=5 + turn,
                                                    temperature=0.3, logprobs=True)
                msgs.append(_assistant(r.choices[0].message))
                for k in range(turn + 1 if turn < 2 else 0):
                    msgs.append({"role": "tool", "tool_call_id": f"c{turn}{k}", "content": f"result {turn}.{k}"})
            FINAL[sample.index] = r.choices[0].message.content
        return None

    async def restart(args, sample, base_url):
        """Two calls; the second starts a new conversation (does not extend the first): two samples, reward 0.25."""
        async with _client(base_url) as c:
            await c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "first"}],
                                            max_tokens=4)
            await c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "second"}],
                                            max_tokens=3)
        return 0.25

    async def raw_tokens(args, sample, base_url):
        """/completions with token ids, continued by token ids: one sample; a dict reward."""
        async with _client(base_url) as c:
            r = await c.completions.create(model="policy", prompt=[1, 2, 3, 4], max_tokens=3,
                                           extra_body={"return_token_ids": True})
            ids = [1, 2, 3, 4] + r.choices[0].token_ids + [9, 9]
            await c.completions.create(model="policy", prompt=ids, max_tokens=2)
        return {"reward": 0.5, "calls": 2}

    async def broken(args, sample, base_url):
        async with _client(base_url) as c:
            await c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        raise RuntimeError("agent bug")

    async def even_reward(args, sample, base_url):
        """Two chat calls continuing each other; reward = share of even token ids (varied, for training)."""
        async with _client(base_url) as c:
            msgs = [{"role": "user", "content": sample.prompt}]
            ids = []
            for _ in range(2):
                r = await c.chat.completions.create(model="policy", messages=msgs, max_tokens=4,
                                                    extra_body={"return_token_ids": True})
                ids += r.choices[0].token_ids
                msgs += [_assistant(r.choices[0].message), {"role": "tool", "content": "ok"}]
        return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)

    async def restart_even(args, sample, base_url):
        """Two calls that do not extend each other (two samples); reward = share of even ids in the answers."""
        ids = []
        async with _client(base_url) as c:
            for q in ("first", "second"):
                r = await c.chat.completions.create(model="p", messages=[{"role": "user", "content": q}],
                                                    max_tokens=3, extra_body={"return_token_ids": True})
                ids += r.choices[0].token_ids
        return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)

    async def two_calls(args, sample, base_url):
        async with _client(base_url) as c:
            for _ in range(2):
                await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}], max_tokens=4)
        return 1.0

    SEEN = {}       # probe_web_page: the statuses a web page's requests got

    async def probe_web_page(args, sample, base_url):
        """A page in the user's browser (foreign Origin, rebound Host) tries the session; then a real call."""
        import aiohttp
        body = {"model": "p", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        async with aiohttp.ClientSession() as s:
            for name, headers in (("origin", {"Origin": "http://evil.example"}),
                                  ("host", {"Host": "attacker.example"})):
                async with s.post(base_url + "/chat/completions", json=body, headers=headers) as r:
                    SEEN[name] = r.status
        async with _client(base_url) as c:
            await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        return 1.0

    def rm_length(args, sample):
        return float(len(sample.response))

    def rm_final(args, sample):
        """1.0 when the reward sees the agent's final assistant message."""
        return float(sample.response == FINAL.get(sample.index))
''')


@pytest.fixture(scope="module")
def agents_module(tmp_path_factory):
    d = tmp_path_factory.mktemp("agents")
    (d / "slick_test_agents.py").write_text(AGENTS)
    sys.path.insert(0, str(d))
    yield __import__("slick_test_agents")
    sys.path.remove(str(d))
    sys.modules.pop("slick_test_agents", None)


class Spy:
    """The real engine, with every request it served written down (prompt ids, Generation)."""

    def __init__(self, engine):
        self.engine, self.seen = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    async def generate(self, prompt_ids, sampling, rid=None):
        gen = await self.engine.generate(prompt_ids, sampling, rid=rid)
        self.seen.append((list(prompt_ids), gen, sampling))
        return gen


def make_cfg(model_dir, fn, **over):
    values = dict(hf_checkpoint=str(model_dir), agent_function_path=f"slick_test_agents.{fn}", dtype="fp32",
                  rollout_max_response_len=16, rollout_batch_size=1, n_samples_per_prompt=1, rollout_temperature=1.0,
                  custom_rm_path="slick_test_agents.rm_final", rm_failure_reward=-1.0)
    values.update(over)
    return validate_config(Config.from_flat(values), check_files="prompt_data" in over)


def run_agent(model_dir, fn, samples, engine=None, **over):
    """Run the agent rollout for one group in a fresh event loop; returns (samples, spy, rollout).
    ``engine``: a zero-argument factory of the engine (default: an in-process LocalEngine)."""
    cfg = make_cfg(model_dir, fn, **over)

    async def go():
        from slick.models.tiny import load_demo_tokenizer

        eng = engine() if engine else LocalEngine(model_dir, dtype="fp32", seed=0)
        tok = load_demo_tokenizer()
        spy = Spy(eng)
        hub = RewardHub(cfg)
        agent = AgentRollout(cfg, lambda: spy, tok, hub)
        sampling = sampling_from_config(cfg, stop_token_ids=[tok.eos_token_id])
        try:
            out = await agent.run_group(samples, sampling, lambda s: seeded(sampling, 1, "train", s))
        finally:
            await agent.close()
            await hub.close()
            await eng.close()
        return out, spy, agent

    return asyncio.run(go())


def test_three_call_session_is_one_exact_sample(tiny_model_dir, agents_module):
    out, spy, agent = run_agent(tiny_model_dir, "three_calls", [Sample(index=7, prompt="add 2 and 3")])
    assert len(spy.seen) == 3 and len(out) == 1
    s = out[0]
    last_prompt, last_gen, _ = spy.seen[-1]
    # tokens: exactly the last prompt the engine saw + what it sampled; every call's prompt extends the previous
    assert s.prompt_ids == spy.seen[0][0]
    assert s.prompt_ids + s.response_ids == last_prompt + last_gen.token_ids
    for (p0, g0, _), (p1, _, _) in zip(spy.seen, spy.seen[1:]):
        assert p1[:len(p0) + len(g0.token_ids)] == p0 + g0.token_ids
    # loss mask 1 exactly on sampled tokens, their logprobs and versions are the engine's, gaps are 0
    want_mask, want_lp = [], []
    end = len(s.prompt_ids)
    for p, g, _ in spy.seen:
        want_mask += [0] * (len(p) - end) + [1] * len(g.token_ids)
        want_lp += [0.0] * (len(p) - end) + list(g.logprobs)
        end = len(p) + len(g.token_ids)
    assert s.loss_mask == want_mask
    assert s.rollout_logprobs == want_lp
    assert sum(s.loss_mask) == sum(len(g.token_ids) for _, g, _ in spy.seen)
    assert len(s.weight_versions) == len(s.response_ids) and set(s.weight_versions) == {0}
    # the gaps hold the tool results as the chat template renders them (three tool messages)
    from slick.models.tiny import load_demo_tokenizer

    gaps = load_demo_tokenizer().decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 0])
    assert "result 0.0" in gaps and "result 1.0" in gaps and "result 1.1" in gaps
    assert gaps.count("<|im_start|>tool") == 3 and gaps.count("<|im_start|>assistant") == 2
    # the session's sampling is the rollout's (temperature 1.0 replaces the agent's 0.3), max_tokens honoured
    assert [sp.temperature for _, _, sp in spy.seen] == [1.0] * 3
    assert [sp.max_new_tokens for _, _, sp in spy.seen] == [5, 6, 7]
    # None: the configured reward scored the final assistant message
    assert s.response == agents_module.FINAL[7] and s.reward == 1.0
    assert s.status in (Status.COMPLETED, Status.TRUNCATED)
    assert agent.metrics(out) == {"rollout/agent_calls/mean": 3.0, "rollout/agent_samples/mean": 1.0,
                                  "rollout/agent_errors": 0.0}


def test_agent_through_http_engine(tiny_model_dir, agents_module):
    """--rollout-engine http: the endpoint forwards to a real `slick serve` worker and records the same way."""
    from slick.engines.client import HttpEngine
    from slick.engines.router import launch_workers

    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240)
    try:
        out, spy, _ = run_agent(tiny_model_dir, "three_calls", [Sample(index=9, prompt="hi")],
                                engine=lambda: HttpEngine([w.url]))
    finally:
        w.stop()
    assert len(spy.seen) == 3 and len(out) == 1
    s, (p, g, _) = out[0], spy.seen[-1]
    assert s.prompt_ids + s.response_ids == p + g.token_ids
    assert sum(s.loss_mask) == sum(len(x.token_ids) for _, x, _ in spy.seen)
    assert [lp for lp, m in zip(s.rollout_logprobs, s.loss_mask) if m] == [
        lp for _, x, _ in spy.seen for lp in x.logprobs]
    assert s.reward == 1.0


def test_session_that_restarts_becomes_two_samples(tiny_model_dir, agents_module):
    out, spy, agent = run_agent(tiny_model_dir, "restart", [Sample(index=3, prompt="ignored")])
    assert len(spy.seen) == 2 and len(out) == 2
    for s, (p, g, _) in zip(out, spy.seen):
        assert s.prompt_ids == p and s.response_ids == g.token_ids
        assert s.loss_mask == [1] * len(g.token_ids) and s.rollout_logprobs == list(g.logprobs)
        assert s.reward == 0.25                      # a returned float is every sample's reward
    assert agent.metrics(out)["rollout/agent_samples/mean"] == 2.0


def test_completions_token_ids_continue_and_dict_reward(tiny_model_dir, agents_module):
    out, spy, _ = run_agent(tiny_model_dir, "raw_tokens", [Sample(index=1, prompt="x")])
    assert len(out) == 1
    s = out[0]
    (p0, g0, _), (p1, g1, _) = spy.seen
    assert s.prompt_ids == [1, 2, 3, 4] and p1 == p0 + g0.token_ids + [9, 9]
    assert s.response_ids == g0.token_ids + [9, 9] + g1.token_ids
    assert s.loss_mask == [1] * len(g0.token_ids) + [0, 0] + [1] * len(g1.token_ids)
    assert s.reward == {"reward": 0.5, "calls": 2}


def test_failing_agent_fails_its_sample_only(tiny_model_dir, agents_module):
    out, _, agent = run_agent(tiny_model_dir, "broken", [Sample(index=0, prompt="a"), Sample(index=1, prompt="b")])
    assert len(out) == 2
    for s in out:
        assert s.status == Status.FAILED and s.reward == -1.0 and s.loss_mask == [0]
        assert "RuntimeError: agent bug" in s.metadata["agent_error"]
    assert agent.metrics(out)["rollout/agent_errors"] == 2.0


def test_call_tree_and_branches():
    """Pure: n=2 at the first call, the second call continues choice 1 -> two samples sharing the prompt."""
    c0 = Call("completion", [5, 6], [Choice([7, 8], [-0.1, -0.2], [0, 0], "length"),
                                     Choice([9], [-0.3], [1], "stop")])
    c1 = Call("completion", [5, 6, 9, 4], [Choice([3], [-0.5], [1], "stop")])
    assert call_tree([c0, c1]) == {1: (0, 1)}
    out = trajectory_samples(Sample(index=2, prompt="p"), [c0, c1])
    assert [(s.prompt_ids, s.response_ids, s.loss_mask) for s in out] == [
        ([5, 6], [7, 8], [1, 1]), ([5, 6], [9, 4, 3], [1, 0, 1])]
    assert out[1].rollout_logprobs == [-0.3, 0.0, -0.5] and out[1].weight_versions == [1, 1, 1]
    assert out[0].status == Status.TRUNCATED and out[1].status == Status.COMPLETED


def test_agent_function_must_be_async(tiny_model_dir, agents_module):
    cfg = make_cfg(tiny_model_dir, "rm_final")
    with pytest.raises(ValueError, match="--agent-function-path.*async def"):
        AgentRollout(cfg, lambda: None, None, None)


def test_agent_rollout_in_slick_train(tiny_model_dir, agents_module, tmp_path):
    """Two steps of `slick train` whose rollout is the black-box agent (2 prompts x 2 sessions)."""
    from slick.loop.sync import train

    rows = [{"prompt": f"question {i}", "label": str(i)} for i in range(4)]
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = make_cfg(tiny_model_dir, "even_reward", prompt_data=str(data), rollout_batch_size=2,
                   n_samples_per_prompt=2, num_rollout=2, lr=1e-3, run_dir=str(tmp_path / "run"), no_progress=True,
                   micro_batch_size=4, custom_rm_path=None, save_debug_rollout_data=str(tmp_path / "dbg"))
    run = asyncio.run(train(cfg))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/agent_calls/mean"] == 2.0 and r["rollout/agent_samples/mean"] == 1.0 for r in rows)
    assert all(r["rollout/agent_errors"] == 0.0 for r in rows)
    assert run.train_parts.trainer.version == 2
    assert run.rollout_parts.manager.agent._runner is None          # the endpoint closed with the run


def _sample(mask, sid, reward):
    return Sample(response_ids=[5] * len(mask), loss_mask=mask, prompt_ids=[1], reward=reward,
                  metadata={"agent_session": {"id": sid, "calls": 1, "chain": []}})


def test_session_advantages_one_per_session():
    """GRPO over sessions (the last sample of each stands for it); every sample of a session gets its advantage."""
    from slick.algo.assemble import Advantages

    samples = [_sample([1, 0, 1], "a", 1.0), _sample([1, 1], "a", 1.0), _sample([0, 1], "b", 0.0)]
    cfg = make_cfg_plain(advantage_estimator="grpo", n_samples_per_prompt=2)
    adv = Advantages.from_config(cfg).compute(samples, [1.0, 1.0, 0.0])
    a = 0.5 / (0.5 ** 0.5 + 1e-6)            # (1 - 0.5) / (unbiased std of [1, 0] + 1e-6)
    assert [x.tolist() for x in adv] == [pytest.approx([a, 0, a]), pytest.approx([a, a]), pytest.approx([0, -a])]
    cfg = make_cfg_plain(advantage_estimator="ppo", n_samples_per_prompt=2)
    with pytest.raises(ValueError, match="agent session.*several training samples.*--advantage-estimator"):
        Advantages.from_config(cfg).compute(samples, [1.0, 1.0, 0.0])


def make_cfg_plain(**over):
    values = dict(rollout_batch_size=1, n_samples_per_prompt=2)
    values.update(over)
    return validate_config(Config.from_flat(values), check_files=False)


def test_split_sessions_train(tiny_model_dir, agents_module, tmp_path):
    """`slick train` with sessions that become two samples each: one advantage per session, every sample trained."""
    from slick.loop.sync import train

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(2)))
    cfg = make_cfg(tiny_model_dir, "restart_even", prompt_data=str(data), rollout_batch_size=2,
                   n_samples_per_prompt=2, num_rollout=1, lr=1e-3, run_dir=str(tmp_path / "run"), no_progress=True,
                   micro_batch_size=8, custom_rm_path=None, save_debug_train_data=str(tmp_path / "dbg"))
    run = asyncio.run(train(cfg))
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/agent_samples/mean"] == 2.0 and run.train_parts.trainer.version == 1
    assert row["train/loss"] == row["train/loss"]      # finite, not NaN
    rows = [json.loads(x) for x in (tmp_path / "dbg" / "train_0.jsonl").read_text().splitlines()]
    assert len(rows) == 8                              # 2 prompts x 2 sessions x 2 samples, all trained
    for a, b in zip(rows[::2], rows[1::2]):            # the two samples of a session share its advantage
        assert a["reward"] == b["reward"] and a["advantages"][0] == b["advantages"][0]
        assert all(x == a["advantages"][0] for x in a["advantages"] + b["advantages"])
    for g in (rows[:4], rows[4:]):                     # GRPO over the group's two sessions: +a and -a (or 0, 0)
        assert g[0]["advantages"][0] == pytest.approx(-g[2]["advantages"][0], abs=1e-5)


@pytest.mark.parametrize("over,needle", [
    (dict(agent_function_path="m.run", tool_path="m.tools", max_turns=2),
     "--agent-function-path generates every sample through the agent's own calls; it cannot be combined with "
     "--tool-path, --max-turns 2"),
    (dict(agent_function_path="m.run", custom_generate_function_path="m.gen"), "--custom-generate-function-path"),
    (dict(agent_function_path="m.run", partial_rollout=True), "--partial-rollout cannot continue a black-box agent"),
    (dict(agent_timeout=0), "--agent-timeout must be > 0 seconds (got 0)"),
    (dict(agent_max_calls=0), "--agent-max-calls must be >= 1 (got 0)"),
])
def test_agent_flags_refused(over, needle):
    from slick.config import ConfigError

    with pytest.raises(ConfigError) as e:
        make_cfg_plain(**over)
    assert needle in str(e.value)


def test_docs_example(tiny_model_dir, agents_module, tmp_path):
    """The agent printed in docs/agents.md (Black-box agents), run verbatim: one sample, scored by the reward."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "agents.md").read_text()
    section = doc[doc.index("## Black-box agents"):]
    code = section[section.index("```python\n") + len("```python\n"):]
    (tmp_path / "docs_agent.py").write_text(code[:code.index("```")])
    sys.path.insert(0, str(tmp_path))
    try:
        out, spy, agent = run_agent(tiny_model_dir, "x", [Sample(index=4, prompt="What is 2 + 3?")],
                                    agent_function_path="docs_agent.run",
                                    custom_rm_path="slick_test_agents.rm_length")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("docs_agent", None)
    assert len(out) == 1 and len(spy.seen) >= 1 and agent.metrics(out)["rollout/agent_errors"] == 0.0
    s = out[0]
    assert s.prompt_ids + s.response_ids == spy.seen[-1][0] + spy.seen[-1][1].token_ids
    assert s.reward == float(len(s.response))


def test_agent_rollout_in_train_async(tiny_model_dir, agents_module, tmp_path):
    """`slick train-async` (one step off, weights updated in place while sessions run): every step trains the
    agent's samples, each within the staleness bound."""
    from slick.loop.train_async import train_async

    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(6)))
    values = dict(hf_checkpoint=str(tiny_model_dir), agent_function_path="slick_test_agents.even_reward",
                  prompt_data=str(data), rollout_batch_size=2, n_samples_per_prompt=2, num_rollout=3, lr=1e-3,
                  dtype="fp32", run_dir=str(tmp_path / "run"), no_progress=True, micro_batch_size=4, use_tis=True,
                  max_staleness=1, async_weight_update="continue", rollout_max_response_len=8,
                  save_debug_train_data=str(tmp_path / "dbg"))
    run = asyncio.run(train_async(validate_config(Config.from_flat(values), driver="async")))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and run.train_parts.trainer.version == 3
    assert all(r["rollout/agent_calls/mean"] == 2.0 and r["rollout/agent_errors"] == 0.0 for r in rows)
    for step in range(3):
        trained = [json.loads(x) for x in (tmp_path / "dbg" / f"train_{step}.jsonl").read_text().splitlines()]
        assert len(trained) == 4
        assert all(r["train_version"] - min(r["weight_versions"]) <= 1 for r in trained)
        assert all(2 <= sum(r["loss_mask"]) <= 8 for r in trained)   # 2 calls x at most 4 sampled tokens


def test_session_continues_an_answer_with_tool_calls_token_exactly():
    """An answer whose text holds a Hermes call comes back as tool_calls; the agent's next request (that message
    + a tool result) continues its sampled tokens exactly, with the template's delta for the tool message."""
    from slick.serve.openai_protocol import Choice, parse_messages, render_chat, split_tool_calls
    from slick.models.tiny import load_demo_tokenizer
    from slick.rollout.agent import AgentSession
    from slick.chat.toolcall import get_parser
    from slick.types import SamplingParams

    tok = load_demo_tokenizer()
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = parse_messages({"messages": [{"role": "user", "content": "2+3?"}]})
    session = AgentSession("s", tok, SamplingParams(seed=1), max_calls=4)
    ids, text, parent = session.chat_prompt(msgs, tools)
    assert (ids, text) == render_chat(tok, msgs, tools) and parent is None
    answer = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    sampled = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    content, calls = split_tool_calls(answer, get_parser("hermes"))
    message = {"role": "assistant", "content": content, "tool_calls": calls}
    session.record(Call("chat", ids, [Choice(sampled, [-1.0] * len(sampled), [0] * len(sampled), "stop",
                                             message=message)], messages=msgs, tools=tools, prompt_text=text))
    sent = {"role": "assistant", "content": content, "tool_calls": calls}     # as an OpenAI client sends it back
    follow = parse_messages({"messages": [{"role": "user", "content": "2+3?"}, sent,
                                          {"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"}]})
    ids2, _, parent2 = session.chat_prompt(follow, tools)
    assert parent2 == (0, 0) and ids2[:len(ids) + len(sampled)] == ids + sampled
    assert tok.decode(ids2[len(ids) + len(sampled):]) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    # a changed tool call is not the answer slick gave: the conversation is rendered afresh (a new sample)
    sent_changed = {**sent, "tool_calls": [{**calls[0], "function": {"name": "add", "arguments": '{"a": 9}'}}]}
    other = parse_messages({"messages": [{"role": "user", "content": "2+3?"}, sent_changed,
                                         {"role": "tool", "content": "9"}]})
    assert session.chat_prompt(other, tools)[2] is None


def test_aborted_session_comes_back_to_start_over(tiny_model_dir, agents_module):
    """The rollout aborts a session's request (over-sampling leftovers, shutdown): the agent's next call is refused
    and the group comes back unchanged with status ABORTED, so the manager puts it back."""
    import time

    cfg = make_cfg(tiny_model_dir, "two_calls")

    async def go():
        eng = LocalEngine(tiny_model_dir, dtype="fp32", seed=0)
        hub = RewardHub(cfg)
        agent = AgentRollout(cfg, lambda: eng, eng.tokenizer, hub)
        sampling = sampling_from_config(cfg, stop_token_ids=[eng.tokenizer.eos_token_id])
        group = [Sample(index=0, prompt="x")]
        try:
            await eng.pause_generation()
            task = asyncio.ensure_future(agent.run_group(group, sampling, lambda s: seeded(sampling, 1, "t", s)))
            deadline = time.monotonic() + 60
            while not eng.progress():
                assert time.monotonic() < deadline, "timed out waiting for the agent's first request in the engine"
                await asyncio.sleep(0.01)
            await eng.abort_all()
            await eng.continue_generation()
            out = await asyncio.wait_for(task, 60)
        finally:
            await agent.close()
            await hub.close()
            await eng.close()
        return group, out

    group, out = asyncio.run(go())
    assert out is group and group[0].status == Status.ABORTED
    assert group[0].response_ids == [] and group[0].reward is None


def test_web_page_cannot_drive_an_agent_session(tiny_model_dir, agents_module):
    """The per-session OpenAI endpoint refuses a foreign Origin and a rebound Host (docs/security.md); the
    agent's own calls go on and make one sample."""
    out, spy, _ = run_agent(tiny_model_dir, "probe_web_page", [Sample(index=3, prompt="p")])
    assert agents_module.SEEN == {"origin": 403, "host": 403}
    assert len(spy.seen) == 1 and len(out) == 1 and out[0].reward == 1.0

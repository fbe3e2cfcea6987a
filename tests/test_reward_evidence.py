"""Verifier evidence (Sample.evidence) for every reward type, against hand-written responses.

Rule types are scored through the real RewardHub; custom functions are real modules written to tmp_path;
remote_rm talks to a real aiohttp server on 127.0.0.1 (random port)."""
import asyncio
import itertools
import json
import sys
import textwrap

import pytest
from aiohttp import web

from slick.config import Config
from slick.loop import debug
from slick.reward import RewardHub
from slick.reward.evidence import KEYS
from slick.reward.registry import get_judge_fn, get_score_fn
from slick.types import Sample

_ids = itertools.count()


def make_cfg(**kw):
    kw.setdefault("rm_timeout", 120.0)   # a loaded machine imports math-verify (sympy) slowly
    return Config.from_flat(kw)


def score(hub, samples, group_rm=False):
    async def go():
        try:
            await hub.score_group(samples)
        finally:
            await hub.close()
    asyncio.run(go())
    return samples


def sample(response, label, rm_type=None, index=0):
    return Sample(index=index, response=response, label=label, metadata={"rm_type": rm_type} if rm_type else {})


def without_seconds(ev):
    assert isinstance(ev["seconds"], float) and 0.0 <= ev["seconds"] < 120.0, ev
    return {k: v for k, v in ev.items() if k != "seconds"}


# ---------------------------------------------------------------- rule types

def test_gsm8k_evidence():
    g = [sample("She has 3 + 4 = 7 apples. #### 7", "#### 7"), sample("so $1,234.50 total", 1234.5, index=1),
         sample("no number here", 3, index=2), sample("5", 6, index=3)]
    score(RewardHub(make_cfg(rm_type="gsm8k")), g)
    assert [s.reward for s in g] == [1.0, 1.0, 0.0, 0.0]
    base = {"reward_type": "gsm8k", "error": None}
    assert without_seconds(g[0].evidence) == {**base, "answer": "7", "verdict": True, "gold": "7"}
    assert without_seconds(g[1].evidence) == {**base, "answer": "2469/2", "verdict": True, "gold": "2469/2"}
    assert without_seconds(g[2].evidence) == {**base, "answer": None, "verdict": False, "gold": "3"}
    assert without_seconds(g[3].evidence) == {**base, "answer": "5", "verdict": False, "gold": "6"}
    assert g[0].evidence["seconds"] == g[0].timings["reward_time"]


def test_math_evidence_uses_the_extracted_answer():
    g = [sample("so the answer is \\boxed{\\frac{1}{2}}", "0.5"), sample("\\boxed{3}", "4", index=1),
         sample("I do not know", "4", index=2)]
    score(RewardHub(make_cfg(rm_type="math")), g)
    assert [s.reward for s in g] == [1.0, 0.0, 0.0]
    assert without_seconds(g[0].evidence) == {"reward_type": "math", "answer": "\\frac{1}{2}", "verdict": True,
                                              "error": None, "gold": "\\frac{1}{2}"}  # as math-verify read it
    assert (g[1].evidence["answer"], g[1].evidence["verdict"], g[1].evidence["gold"]) == ("3", False, "4")
    assert (g[2].evidence["answer"], g[2].evidence["verdict"]) == (None, False)


def test_countdown_evidence_names_the_reason():
    task = {"target": 50, "numbers": [4, 5, 6]}
    g = [sample("<answer>(6+4)*5</answer>", task), sample("<answer>6*5+4</answer>", task, index=1),
         sample("<answer>4*5*6</answer>", task, index=2), sample("<answer>__import__('os')</answer>", task, index=3),
         sample("", task, index=4), sample("<answer>5/(4-4)</answer>", {"target": 1, "numbers": [5, 4, 4]}, index=5)]
    score(RewardHub(make_cfg(rm_type="countdown")), g)
    assert [s.reward for s in g] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    ev = [without_seconds(s.evidence) for s in g]
    assert ev[0] == {"reward_type": "countdown", "answer": "(6+4)*5", "verdict": True, "error": None,
                     "target": 50, "numbers": [4, 5, 6], "value": "50", "numbers_used": [6, 4, 5], "reason": None}
    assert (ev[1]["value"], ev[1]["reason"]) == ("34", "value is not the target")
    assert (ev[2]["value"], ev[2]["reason"]) == ("120", "value is not the target")
    assert ev[3]["answer"] == "__import__('os')" and ev[3]["value"] is None
    assert ev[3]["reason"] == "disallowed syntax: Call"
    assert (ev[4]["answer"], ev[4]["reason"]) == (None, "no expression")
    assert ev[5]["reason"] == "division by zero"


def test_countdown_wrong_numbers():
    g = [sample("<answer>50</answer>", {"target": 50, "numbers": [4, 5, 6]})]
    score(RewardHub(make_cfg(rm_type="countdown")), g)
    assert (g[0].evidence["value"], g[0].evidence["numbers_used"], g[0].evidence["reason"]) == \
        ("50", [50], "numbers not used exactly once")


def test_exact_f1_and_boxed_evidence():
    g = [sample("  Paris ", "Paris", "exact"), sample("the Eiffel tower", ["eiffel tower", "louvre"], "f1", 1),
         sample("Eiffel", ["eiffel tower", "louvre"], "f1", 2),
         sample("it is \\boxed{42} ok", 42, "boxed_gsm8k", 3), sample("42", 42, "boxed_gsm8k", 4)]
    score(RewardHub(make_cfg(rm_type="exact")), g)
    assert [s.reward for s in g] == [1.0, 1.0, pytest.approx(2 / 3), 1.0, 0.0]
    ev = [without_seconds(s.evidence) for s in g]
    assert ev[0] == {"reward_type": "exact", "answer": "Paris", "verdict": True, "error": None}
    assert ev[1] == {"reward_type": "f1", "answer": "the Eiffel tower", "verdict": True, "error": None,
                     "f1": 1.0, "best_label": "eiffel tower"}
    assert (ev[2]["verdict"], ev[2]["f1"], ev[2]["best_label"]) == (False, pytest.approx(2 / 3), "eiffel tower")
    assert ev[3] == {"reward_type": "boxed_gsm8k", "answer": "42", "verdict": True, "error": None,
                     "gold": "42", "box": "42"}
    assert ev[4] == {"reward_type": "boxed_gsm8k", "answer": None, "verdict": False, "error": None, "box": None}


def test_judge_and_score_agree():
    cases = [("math", "\\boxed{2}", "2"), ("gsm8k", "#### 3", 4), ("countdown", "1+2", {"target": 3, "numbers": [1, 2]}),
             ("exact", "a", "a"), ("f1", "a b c", "a b"), ("boxed_math", "\\boxed{x+1}", "1+x")]
    for rm_type, response, label in cases:
        assert get_judge_fn(rm_type)(response, label, {}).score == get_score_fn(rm_type)(response, label, {})


def test_bad_label_evidence_has_the_error():
    g = [sample("#### 7", {"oops": 1}, "gsm8k")]
    hub = RewardHub(make_cfg(rm_type="gsm8k"))
    seen = []
    hub.on_scored = seen.append
    score(hub, g)
    ev = without_seconds(g[0].evidence)
    assert ev == {"reward_type": "gsm8k", "answer": None, "verdict": None,
                  "error": g[0].metadata["reward_error"]}
    assert ev["error"].startswith("LabelError: gsm8k reward: label must be")
    assert seen == g


# ---------------------------------------------------------------- custom functions

PLUGIN = '''
import time

def rm(args, sample):
    sample.evidence["judge_note"] = "looked at " + sample.response
    if sample.response == "boom":
        raise RuntimeError("kaboom")
    if sample.response == "slow":
        time.sleep(0.6)
    if sample.response == "nan":
        return {"reward": float("nan"), "answer": "?"}
    if sample.response == "num":
        return 0.25
    return {"reward": 1.0, "answer": sample.response.upper(), "verdict": True, "n": 3}

def group_rm(args, samples):
    return [{"reward": float(i), "rank": i} for i, _ in enumerate(samples)]
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    name = f"slick_test_evidence_rm_{next(_ids)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_custom_function_evidence(plugin):
    g = [sample(r, None, index=i) for i, r in enumerate(["yes", "num", "boom", "nan", "slow"])]
    score(RewardHub(make_cfg(custom_rm_path=f"{plugin}.rm", rm_timeout=0.3)), g)
    assert [s.reward for s in g] == [{"reward": 1.0, "answer": "YES", "verdict": True, "n": 3}, 0.25, 0.0, 0.0, 0.0]
    ev = [without_seconds(s.evidence) for s in g]
    fn = f"{plugin}.rm"
    assert ev[0] == {"judge_note": "looked at yes", "reward_type": "custom", "answer": "YES", "verdict": True,
                     "error": None, "function": fn, "reply": {"reward": 1.0, "answer": "YES", "verdict": True, "n": 3}}
    assert ev[1] == {"judge_note": "looked at num", "reward_type": "custom", "answer": None, "verdict": None,
                     "error": None, "function": fn, "reply": 0.25}
    assert ev[2] == {"judge_note": "looked at boom", "reward_type": "custom", "answer": None, "verdict": None,
                     "error": "RuntimeError: kaboom", "function": fn}
    assert ev[3]["error"].startswith("NonFiniteRewardError") and ev[3]["reply"]["answer"] == "?"
    assert ev[4]["error"] == "timed out after 0.3s" and g[4].evidence["seconds"] >= 0.3
    json.dumps([s.evidence for s in g])          # JSON-able (NaN is written as NaN by the json module)


def test_group_custom_function_evidence(plugin):
    g = [sample(r, None, index=i) for i, r in enumerate(["a", "b"])]
    score(RewardHub(make_cfg(custom_rm_path=f"{plugin}.group_rm", group_rm=True)), g)
    assert [without_seconds(s.evidence)["reply"] for s in g] == [{"reward": 0.0, "rank": 0},
                                                                 {"reward": 1.0, "rank": 1}]
    assert g[0].evidence["seconds"] == g[1].evidence["seconds"]


# ---------------------------------------------------------------- remote reward model

class Judge:
    """A real reward server: /ok answers a dict with answer and verdict, /teapot HTTP 418."""

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/ok", self.ok)
        app.router.add_post("/teapot", self.teapot)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()

    async def ok(self, request):
        b = await request.json()
        return web.json_response({"reward": float(b["response"] == b["label"]), "answer": b["response"],
                                  "verdict": b["response"] == b["label"], "why": "string compare"})

    async def teapot(self, request):
        return web.Response(status=418, text="no")


def test_remote_rm_evidence_keeps_the_reply():
    async def go():
        async with Judge() as srv:
            out = []
            for route in ("ok", "teapot"):
                hub = RewardHub(make_cfg(rm_type="remote_rm", rm_url=f"http://127.0.0.1:{srv.port}/{route}",
                                         rm_max_retries=0))
                g = [sample("yes", "yes"), sample("no", "yes", index=1)]
                try:
                    await hub.score_group(g)
                finally:
                    await hub.close()
                out.append(g)
            return out
    ok, bad = asyncio.run(go())
    assert without_seconds(ok[0].evidence) == {
        "reward_type": "remote_rm", "answer": "yes", "verdict": True, "error": None,
        "reply": {"reward": 1.0, "answer": "yes", "verdict": True, "why": "string compare"}}
    assert (ok[1].evidence["answer"], ok[1].evidence["verdict"]) == ("no", False)
    ev = without_seconds(bad[0].evidence)
    assert ev["reward_type"] == "remote_rm" and ev["verdict"] is None and "HTTP 418" in ev["error"]


# ---------------------------------------------------------------- round trips

def test_evidence_survives_to_dict_and_debug_rollout_files(tmp_path):
    g = [sample("#### 7", 7, "gsm8k"), sample("#### 8", 7, "gsm8k", 1)]
    score(RewardHub(make_cfg(rm_type="gsm8k")), g)
    assert Sample.from_dict(json.loads(json.dumps(g[0].to_dict()))).evidence == g[0].evidence
    debug.save_rollout(str(tmp_path), 3, [g])
    (back,) = debug.load_rollout(str(tmp_path), 3)
    assert [s.evidence for s in back] == [s.evidence for s in g]
    assert all(set(KEYS) <= set(s.evidence) for s in back)


def test_rescoring_replaces_old_evidence():
    s = sample("#### 7", {"bad": 1}, "gsm8k")
    score(RewardHub(make_cfg(rm_type="gsm8k")), [s])
    assert s.evidence["error"] is not None
    s.label = 7
    score(RewardHub(make_cfg(rm_type="gsm8k")), [s])
    assert without_seconds(s.evidence) == {"reward_type": "gsm8k", "answer": "7", "verdict": True, "error": None,
                                           "gold": "7"}


# ---------------------------------------------------------------- multi-turn and agent rollouts (real engine)

from tests.test_agent import agents_module, run_agent  # noqa: E402,F401 - agents_module is a fixture
from tests.test_multiturn import engine, make_cfg as multiturn_cfg, rollout  # noqa: E402,F401 - engine: fixture

_FIXTURES = (agents_module, engine)     # pytest fixtures used by name below


def test_multiturn_environment_samples_keep_evidence(tiny_model_dir, engine):
    from tests.chat_templates import tokenizer_with

    cfg = multiturn_cfg(tiny_model_dir, max_turns=5, max_tokens_per_turn=5,
                        environment_path="tests.test_multiturn:CountdownEnv")
    samples, _, _ = rollout(cfg, tokenizer_with(None), engine)
    assert len(samples) == 4
    for s in samples:
        assert without_seconds(s.evidence) == {"reward_type": "custom", "answer": None, "verdict": None,
                                               "error": None, "function": "slick.rollout.env.env_reward",
                                               "reply": 2.0}
        assert Sample.from_dict(s.to_dict()).evidence == s.evidence


def test_agent_rewards_keep_evidence(tiny_model_dir, agents_module):
    # the agent returned a dict reward itself
    (s,), _, _ = run_agent(tiny_model_dir, "raw_tokens", [Sample(index=1, prompt="x")])
    assert s.evidence == {"reward_type": "agent", "answer": None, "verdict": None, "error": None, "seconds": 0.0,
                          "reply": {"reward": 0.5, "calls": 2}}
    # the agent returned None: the configured reward function scored the final answer
    (s,), _, _ = run_agent(tiny_model_dir, "three_calls", [Sample(index=7, prompt="add 2 and 3")])
    assert s.reward == 1.0
    assert without_seconds(s.evidence) == {"reward_type": "custom", "answer": None, "verdict": None, "error": None,
                                           "function": "slick_test_agents.rm_final", "reply": 1.0}

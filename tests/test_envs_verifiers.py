"""``--environment verifiers:ENV_ID`` with the real verifiers 0.4.0 (slick/rollout/envs/verifiers.py), on a small
environment defined in tests/verifiers_envs/slick_guess_env.py (a taskset from a datasets.Dataset, a rubric, a
multi-turn Env; imported by id as verifiers does): prompt rows, the env's turns and rubric by hand (exact rewards),
episodes through the real rollout with the env's messages masked and a raising env failing only its samples, and
two training steps on a tiny random model."""
import asyncio
import copy
import json
from pathlib import Path

import pytest

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.data import load_prompt_rows
from slick.data.source import DataSource
from slick.types import Sample, Status

pytest.importorskip("verifiers.v1")

ENV_DIR = Path(__file__).parent / "verifiers_envs"
ENV = "verifiers:slick_guess_env"
RM = "slick.rollout.envs.verifiers.rubric_reward"
WRONG = "Wrong, try again."


@pytest.fixture(autouse=True)
def guess_env_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ENV_DIR))
    monkeypatch.setenv("PYTHONPATH", str(ENV_DIR))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def exchange(idx, replies, env_id="slick_guess_env"):
    """The env's answers to ``replies`` on task ``idx``, then the rubric's reward of the conversation."""
    from slick.rollout.envs.verifiers import VerifiersEnv, load, rubric_reward
    rows = {r["metadata"]["verifiers"]["idx"]: r for r in load_prompt_rows(f"verifiers:{env_id}?size=1&seed={idx}")}

    async def go():
        s = Sample(index=0, metadata=copy.deepcopy(rows[idx]["metadata"]))
        env = VerifiersEnv(load(env_id), idx, s)
        out = [await env.reset(s)]
        msgs = list(rows[idx]["prompt"])
        for r in replies:
            msgs.append({"role": "assistant", "content": r})
            s.metadata["multiturn"] = {"messages": list(msgs)}
            obs, reward, done = await env.step(r)
            out.append((obs, reward, done))
            if done:
                break
            msgs.append({"role": "user", "content": obs})
        await env.close()
        return out, s.metadata["verifiers"]["run_rewards"], await rubric_reward(None, s)
    return asyncio.run(go())


def test_rows_turns_and_rubric_by_hand():
    rows = load_prompt_rows(f"{ENV}?size=2&seed=1")
    assert [r["metadata"] for r in rows] == [{"verifiers": {"env": "slick_guess_env", "idx": i}} for i in (1, 2)]
    assert rows[0]["prompt"] == [{"role": "system", "content": "Answer with the number only."},
                                 {"role": "user", "content": "Say the number 1."}]
    # right on the second reply: exact 1.0 + replies 2 x 0.5
    out, run_rewards, reward = exchange(1, ["7", "1"])
    assert out == [None, (WRONG, None, False), (None, None, True)]
    assert run_rewards == {"replies": [2.0, 0.5]} and reward == 2.0
    # never right: the env stops after three replies; exact 0.0 + 3 x 0.5
    out, _, reward = exchange(2, ["7", "8", "9"])
    assert out[-1] == (None, None, True) and len(out) == 4 and reward == 1.5
    # the env's run raises on task 3: the step raises (GuardedEnv fails the sample)
    with pytest.raises(RuntimeError, match="GuessEnv.run raised RuntimeError: the game server fell over"):
        exchange(3, ["3"])


def test_the_example_environment(monkeypatch):
    """examples/verifiers_math: a right first answer ends the episode (correct 1.0 + tagged 0.1); a wrong one gets
    the feedback turn."""
    monkeypatch.syspath_prepend(str(ENV_DIR.parent.parent / "examples" / "verifiers_math"))
    from slick_math_env import FEEDBACK, rows
    answer = rows()[1000]["answer"]
    out, _, reward = exchange(1000, [f"<answer>{answer}</answer>"], "slick_math_env")
    assert out == [None, (None, None, True)] and reward == pytest.approx(1.1)
    out, _, reward = exchange(1000, ["<answer>-1</answer>", f"<answer>{answer}</answer>"], "slick_math_env")
    assert out == [None, (FEEDBACK, None, False), (None, None, True)] and reward == pytest.approx(1.1)
    out, _, reward = exchange(1000, ["no idea", "still none"], "slick_math_env")
    assert out[-1] == (None, None, True) and reward == 0.0


def test_start_up_checks():
    base = dict(hf_checkpoint=None, environment=ENV, apply_chat_template=True, max_turns=3, custom_rm_path=RM,
                prompt_data=f"{ENV}?size=4")
    validate_config(Config.from_flat(base), check_files=False)
    with pytest.raises(ConfigError, match="verifiers:no_such_env: ModuleNotFoundError"):
        validate_config(Config.from_flat(dict(base, environment="verifiers:no_such_env")), check_files=False)
    with pytest.raises(ConfigError, match=f"no reward; --custom-rm-path {RM}"):
        validate_config(Config.from_flat(dict(base, custom_rm_path=None)), check_files=False)


def test_episodes_through_the_rollout(tiny_model_dir):
    """--max-turns 2: the env answers the first reply (masked), the second ends the episode on slick's side and
    reaches the env at close: reward 0.0 + 2 x 0.5 = 1.0. Task 3's env raises: its samples fail, alone."""
    from slick.engine.local import LocalEngine
    from slick.models.tiny import load_demo_tokenizer
    from slick.reward.hub import RewardHub
    from slick.rollout.manager import RolloutManager

    tok = copy.deepcopy(load_demo_tokenizer())
    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), dtype="fp32", device="cpu", seed=7, max_turns=2, environment=ENV,
        prompt_data=f"{ENV}?size=4&seed=0@[1:4]", apply_chat_template=True, custom_rm_path=RM,
        rollout_batch_size=3, n_samples_per_prompt=2, rollout_max_response_len=300, max_tokens_per_turn=3,
        rm_failure_reward=-1.0)), check_files=False)
    rows = load_prompt_rows(cfg.prompt_data)
    for r in rows:
        r["prompt_ids"] = tok(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)["input_ids"]
    engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=8, seed=0)
    manager = RolloutManager(cfg, DataSource(rows, 2), engine, RewardHub(cfg), tok)
    groups, metrics = asyncio.run(manager.generate_rollout(0))
    samples = [s for g in groups for s in g]
    broken = [s for s in samples if s.metadata["verifiers"]["idx"] == 3]
    played = [s for s in samples if s.metadata["verifiers"]["idx"] != 3]
    assert len(played) == 4 and len(broken) == 2 and metrics["rollout/env_errors"] == 2.0
    for s in played:
        st = s.metadata["multiturn"]
        assert st["turns"] == 2 and s.status != Status.FAILED
        assert s.metadata["verifiers"]["run_rewards"] == {"replies": [2.0, 0.5]} and s.reward == 1.0
        assert [m["role"] for m in st["messages"]] == ["system", "user", "assistant", "user", "assistant"]
        assert st["messages"][3]["content"] == WRONG
        assert WRONG in tok.decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 0])
        assert WRONG not in tok.decode([t for t, m in zip(s.response_ids, s.loss_mask) if m == 1])
    for s in broken:
        assert s.status == Status.FAILED and s.reward == -1.0 and set(s.loss_mask) == {0}
        assert "the game server fell over" in s.metadata["env_error"]


def test_two_training_steps(tiny_model_dir, tmp_path):
    from slick.loop.sync import train

    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), prompt_data=f"{ENV}?size=3", environment=ENV, custom_rm_path=RM,
        apply_chat_template=True, max_turns=3, max_tokens_per_turn=4, rollout_batch_size=2, n_samples_per_prompt=2,
        rollout_max_response_len=48, lr=1e-3, num_rollout=2, dtype="fp32", run_dir=str(tmp_path / "run"),
        no_progress=True, seed=3, rollout_seed=5, micro_batch_size=4)))
    asyncio.run(train(cfg))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["reward/failures"] == 0 and r["reward/samples"] > 0 for r in steps)
    assert all(r["rollout/turns/mean"] > 1 for r in steps)

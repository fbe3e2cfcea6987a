"""Bad environment output fails its sample, counted, never the rollout (slick/rollout/env.py, GuardedEnv): a step
that raises, a NaN reward, a non-string observation, a step that returns the wrong shape, a factory that raises;
the other samples of the same rollout go on. Real LocalEngine (tiny random model) and RolloutManager."""
import asyncio
import copy
import math

import pytest

from slick.config import Config
from slick.configure.validate import validate_config
from slick.data.source import DataSource
from slick.engine.local import LocalEngine
from slick.reward.hub import RewardHub
from slick.rollout.env import observation_problem, step_problem
from slick.rollout.manager import RolloutManager
from slick.types import Status

MODES = ["ok", "raises", "nan_reward", "int_observation", "bad_shape", "factory_raises"]


class PickyEnv:
    """Prompt i behaves as MODES[i]: one good observation, then done; or one kind of bad output."""

    def __init__(self, args, sample):
        self.mode = MODES[sample.prompt_index]
        if self.mode == "factory_raises":
            raise RuntimeError("no environment for you")
        self.steps = 0

    def reset(self, sample):
        return None

    def step(self, policy_message):
        self.steps += 1
        if self.mode == "raises":
            raise ValueError("the simulator fell over")
        if self.mode == "nan_reward":
            return "fine", math.nan, False
        if self.mode == "int_observation":
            return 42, 0.0, False
        if self.mode == "bad_shape":
            return "just text"
        return ("again", 1.0, False) if self.steps == 1 else (None, 1.0, True)


@pytest.mark.parametrize("out, problem", [
    (("x", 1.0, True), None), ((None, None, False), None), (([{"role": "tool", "content": "x"}], 0, True), None),
    (({"role": "user", "content": "x"}, 1, False), None),
    ((42, 1.0, True), "observation must be"), (({"role": "user"}, 1.0, True), "observation must be"),
    (("x", math.inf, True), "finite number"), (("x", "1", True), "finite number"), (("x", True, True), "finite"),
    (("x", 1.0, "yes"), "done must be a bool"), ("x", "step must return"), (("x", 1.0), "step must return"),
])
def test_step_problems(out, problem):
    got = step_problem(out)
    assert (got is None) if problem is None else (problem in got)
    assert observation_problem([{"role": "user", "content": 3}]) is not None


def test_bad_environment_output_fails_only_its_sample(tiny_model_dir):
    from slick.models.tiny import load_demo_tokenizer

    tok = copy.deepcopy(load_demo_tokenizer())
    cfg = validate_config(Config.from_flat(dict(
        hf_checkpoint=str(tiny_model_dir), dtype="fp32", device="cpu", seed=7, rm_type=None, max_turns=3,
        custom_rm_path="slick.rollout.env.env_reward", environment_path="tests.test_envs_guard:PickyEnv",
        rollout_batch_size=len(MODES), n_samples_per_prompt=1, rollout_max_response_len=60, max_tokens_per_turn=4,
        rm_failure_reward=-1.0, allow_zero_advantages=True)), check_files=False)
    rows = []
    for i, mode in enumerate(MODES):
        msgs = [{"role": "user", "content": f"play {mode}"}]
        rows.append({"prompt_index": i, "prompt": msgs, "tools": None, "label": None, "metadata": {},
                     "prompt_ids": tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False),
                                       add_special_tokens=False)["input_ids"]})
    engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=8, seed=0)
    manager = RolloutManager(cfg, DataSource(rows, 1), engine, RewardHub(cfg), tok)
    groups, metrics = asyncio.run(manager.generate_rollout(0))
    by_mode = {MODES[g[0].prompt_index]: g[0] for g in groups}
    assert set(by_mode) == set(MODES)
    ok = by_mode.pop("ok")
    assert ok.reward == 2.0 and ok.status != Status.FAILED and "env_error" not in ok.metadata
    assert sum(ok.loss_mask) > 0
    assert metrics["rollout/env_errors"] == 5.0
    want = {"raises": "environment step raised ValueError: the simulator fell over",
            "nan_reward": "reward must be None or a finite number", "int_observation": "observation must be",
            "bad_shape": "step must return (observation, reward, done)",
            "factory_raises": "environment factory raised RuntimeError: no environment for you"}
    for mode, s in by_mode.items():
        assert want[mode] in s.metadata["env_error"], (mode, s.metadata["env_error"])
        assert s.status == Status.FAILED and s.reward == -1.0
        assert len(s.response_ids) > 0 and set(s.loss_mask) == {0}       # tokens kept, nothing trained
        assert s.metadata["multiturn"]["turns"] == 1

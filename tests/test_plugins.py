"""Contract tests for the dotted-path plug-ins the loop calls (the reward and filter plug-ins are
covered in test_reward_hub.py, test_data_buffer.py and test_loop_debug.py)."""
import asyncio
import json
import sys

import pytest

from slick.loop.sync import train
from slick.plugins import load_function
from tests.test_loop import REWARD_MODULE, make_cfg, read_jsonl

PLUGINS = REWARD_MODULE + '''
import torch
from slick.rollout.manager import default_generate
from slick.algo import AdvantageOutputs
from slick.algo.objective import compute_policy_objective
CALLS = {"generate": 0, "loss": 0, "advantage": 0, "rollout": 0}

async def generate(args, sample, sampling_params, engine):
    """Custom generate: tag the sample, then use the default path."""
    CALLS["generate"] += 1
    sample.metadata["custom"] = True
    return await default_generate(args, sample, sampling_params, engine, engine.tokenizer)

def loss(args, inputs):
    CALLS["loss"] += 1
    out, metrics = compute_policy_objective(args, inputs)
    metrics["custom_loss_calls"] = 1.0
    return out, metrics

def advantage(inputs):
    """Every token gets its sample's raw reward minus 0.5."""
    CALLS["advantage"] += 1
    adv = (inputs.rewards.view(-1, 1) - 0.5) * inputs.mask
    return AdvantageOutputs(adv, adv)

async def rollout(args, manager, step):
    """A whole-step replacement: one round of the default rollout, with an extra metric."""
    CALLS["rollout"] += 1
    groups, metrics = await manager.generate_rollout(step)
    metrics["custom/rollout_step"] = step
    return groups, metrics
'''


@pytest.fixture()
def plugin_env(tmp_path):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(8)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "myplugins.py").write_text(PLUGINS)
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("myplugins", None)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("myplugins", None)


def test_all_loop_plugins_are_called_with_their_contract(tiny_model_dir, plugin_env):
    cfg = make_cfg(tiny_model_dir, plugin_env / "p.jsonl", plugin_env / "run", num_rollout=2,
                   custom_rm_path="myplugins.even_tokens",
                   custom_generate_function_path="myplugins.generate",
                   custom_loss_function_path="myplugins.loss",
                   custom_advantage_function_path="myplugins.advantage",
                   rollout_function_path="myplugins.rollout",
                   save_debug_rollout_data=str(plugin_env / "rollouts"),
                   save_debug_train_data=str(plugin_env / "dbg"))
    asyncio.run(train(cfg))
    import myplugins

    assert myplugins.CALLS["rollout"] == 2 and myplugins.CALLS["advantage"] == 2
    assert myplugins.CALLS["generate"] == 2 * 2 * 4  # steps x prompts x samples
    # 8 samples per step, one optimizer step of 2 micro-batches (--micro-batch-size 4): 2 loss calls per step
    assert myplugins.CALLS["loss"] == 2 * 2
    rows = read_jsonl(plugin_env / "run" / "metrics.jsonl")
    assert [r["custom/rollout_step"] for r in rows] == [0, 1]
    assert [r["train/custom_loss_calls"] for r in rows] == [2.0, 2.0]  # summed over the micro-batches
    for step in (0, 1):
        # --save-debug-rollout-data also works with --rollout-function-path: exactly the samples trained on
        rollout = read_jsonl(plugin_env / "rollouts" / f"rollout_{step}.jsonl")
        trained = read_jsonl(plugin_env / "dbg" / f"train_{step}.jsonl")
        assert [s["index"] for s in rollout] == [d["index"] for d in trained] == list(range(8 * step, 8 * step + 8))
        assert [s["prompt_index"] for s in rollout] == [2 * step] * 4 + [2 * step + 1] * 4
        assert [s["reward"] for s in rollout] == [d["reward"] for d in trained]
        assert all(s["metadata"]["custom"] is True and s["response_ids"] for s in rollout)
        for d in trained:  # the custom advantage reached the trainer
            assert all(a == pytest.approx(d["reward"] - 0.5, abs=1e-5) for a in d["advantages"])


def test_bad_plugin_paths_name_the_flag():
    with pytest.raises(ValueError, match="--custom-loss-function-path.*no_such_module"):
        load_function("no_such_module.fn", "--custom-loss-function-path")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_function("slick.rollout.filters.nope", "--dynamic-sampling-filter-path")
    with pytest.raises(ValueError, match="not a dotted path"):
        load_function("justaname", "--rollout-function-path")
    assert load_function(None) is None

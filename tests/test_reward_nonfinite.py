"""Non-finite and non-numeric rewards never reach training: dict rewards are checked at scoring time.

The reward functions are a real module written to tmp_path and loaded by --custom-rm-path.
"""
import asyncio
import itertools
import math
import sys
import textwrap

import pytest

from slick.config import Config
from slick.reward import RewardHub, scalar_reward
from slick.rollout.filters import check_reward_nonzero_std
from slick.types import Sample

_ids = itertools.count()

MODULE = '''
import math

VALUES = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "text": "0.5", "none": None,
          "list": [1.0], "one": 1.0, "half": 0.5}


def dict_rm(args, sample):
    """{"reward": <value named by the response>, "acc": 1.0}"""
    return {"reward": VALUES[sample.response], "acc": 1.0}


async def keyed_rm(args, sample):
    """the scalar lives under "score" (use --reward-key score); "extra" may be non-finite"""
    return {"score": VALUES[sample.response], "extra": VALUES[sample.label or "one"]}


def float_rm(args, sample):
    return VALUES[sample.response]


def group_dict_rm(args, samples):
    return [{"reward": VALUES[s.response], "len": len(s.response)} for s in samples]


def no_key_rm(args, sample):
    return {"acc": 1.0}
'''


@pytest.fixture
def mod(tmp_path, monkeypatch):
    name = f"slick_test_nonfinite_{next(_ids)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def score(cfg_kw, responses, labels=None):
    hub = RewardHub(Config.from_flat(dict(rm_timeout=5.0, rm_failure_reward=-1.0, **cfg_kw)))
    g = [Sample(index=i, group_index=0, response=r, label=(labels[i] if labels else None))
         for i, r in enumerate(responses)]

    async def go():
        try:
            await hub.score_group(g)
        finally:
            await hub.close()
    asyncio.run(go())
    return hub, g


@pytest.mark.parametrize("group_rm", [False, True])
def test_nonfinite_dict_scalar_is_a_counted_failure(mod, group_rm):
    fn = "group_dict_rm" if group_rm else "dict_rm"
    hub, g = score(dict(custom_rm_path=f"{mod}.{fn}", group_rm=group_rm), ["nan", "inf", "-inf", "one"])
    assert [s.reward for s in g[:3]] == [-1.0, -1.0, -1.0]
    for s, v in zip(g[:3], ("nan", "inf", "-inf")):
        assert s.metadata["reward_error"] == \
            f"NonFiniteRewardError: dict reward field 'reward' of sample {s.index} is not finite ({v})"
    assert isinstance(g[3].reward, dict) and hub.scalar(g[3]) == 1.0
    assert "reward_error" not in g[3].metadata
    st = hub.stats()
    assert st["reward/failures"] == 3 and st["reward/nonfinite"] == 3 and st["reward/bad_labels"] == 0
    # what training reads is finite for every sample
    assert [hub.scalar(s) for s in g] == [-1.0, -1.0, -1.0, 1.0]


def test_reward_key_field_is_the_one_checked(mod):
    hub, g = score(dict(custom_rm_path=f"{mod}:keyed_rm", reward_key="score"),
                   ["half", "nan", "text", "none", "list"])
    assert g[0].reward == {"score": 0.5, "extra": 1.0} and hub.scalar(g[0]) == 0.5
    assert "dict reward field 'score' of sample 1 is not finite (nan)" in g[1].metadata["reward_error"]
    assert "dict reward field 'score' of sample 2 must be a number, got str: '0.5'" in g[2].metadata["reward_error"]
    assert "must be a number, got NoneType" in g[3].metadata["reward_error"]
    assert "must be a number, got list" in g[4].metadata["reward_error"]
    st = hub.stats()
    assert st["reward/failures"] == 4 and st["reward/nonfinite"] == 1


def test_missing_scalar_key_is_a_failure_naming_the_keys(mod):
    hub, g = score(dict(custom_rm_path=f"{mod}.no_key_rm"), ["x"])
    assert g[0].reward == -1.0
    assert g[0].metadata["reward_error"] == \
        "KeyError: sample 0 has a dict reward with keys ['acc']; set --reward-key to choose the scalar"
    hub, g = score(dict(custom_rm_path=f"{mod}.no_key_rm", reward_key="score"), ["x"])
    assert "--reward-key 'score' not in the dict reward of sample 0 (keys: ['acc'])" in g[0].metadata["reward_error"]
    assert hub.stats()["reward/failures"] == 1 and hub.stats()["reward/nonfinite"] == 0


def test_other_nonfinite_fields_are_reported_not_failed(mod):
    hub, g = score(dict(custom_rm_path=f"{mod}.keyed_rm", reward_key="score"),
                   ["one", "half", "one"], labels=["inf", "nan", "one"])
    assert [hub.scalar(s) for s in g] == [1.0, 0.5, 1.0]
    assert math.isinf(g[0].reward["extra"]) and math.isnan(g[1].reward["extra"])
    assert g[0].metadata["reward_warning"] == "non-finite dict reward fields (not used for training): 'extra'=inf"
    assert g[1].metadata["reward_warning"] == "non-finite dict reward fields (not used for training): 'extra'=nan"
    assert "reward_warning" not in g[2].metadata
    assert not any("reward_error" in s.metadata for s in g)
    st = hub.stats()
    assert st["reward/nonfinite_fields"] == 2 and st["reward/failures"] == 0 and st["reward/nonfinite"] == 0


def test_plain_float_nonfinite_counts_too(mod):
    hub, g = score(dict(custom_rm_path=f"{mod}.float_rm"), ["nan", "-inf", "half"])
    assert [s.reward for s in g] == [-1.0, -1.0, 0.5]
    assert g[0].metadata["reward_error"] == "NonFiniteRewardError: reward is not finite (nan)"
    assert hub.stats()["reward/nonfinite"] == 2 and hub.stats()["reward/failures"] == 2


def test_scalar_reward_rules():
    assert scalar_reward(0.25) == 0.25 and scalar_reward(True) == 1.0
    assert scalar_reward({"acc": 1.0, "reward": 0.0}) == 0.0
    assert scalar_reward({"acc": 1.0, "reward": 0.0}, "acc") == 1.0
    with pytest.raises(ValueError, match="sample 4 has no reward yet"):
        scalar_reward(None, None, 4)
    with pytest.raises(KeyError, match="set --reward-key"):
        scalar_reward({"acc": 1.0})
    with pytest.raises(KeyError, match=r"--reward-key 'x' not in the dict reward of sample 2 \(keys: \['acc'\]\)"):
        scalar_reward({"acc": 1.0}, "x", 2)
    with pytest.raises(ValueError, match="not finite"):
        scalar_reward({"reward": math.inf})
    with pytest.raises(ValueError, match="not finite"):
        scalar_reward(math.nan)
    with pytest.raises(ValueError, match="must be a number, got str"):
        scalar_reward({"reward": "1"})


def test_filter_and_hub_read_the_same_scalar(mod):
    """{"acc": 1.0, "reward": 0.0}: both read "reward" (0.0); the filter used to take the first value."""
    cfg = Config.from_flat(dict(rm_type="exact"))
    hub = RewardHub(cfg)
    a = Sample(index=0, reward={"acc": 1.0, "reward": 0.0})
    b = Sample(index=1, reward={"acc": 0.0, "reward": 0.0})
    assert hub.scalar(a) == hub.scalar(b) == 0.0
    assert check_reward_nonzero_std(cfg, [a, b]) is False        # equal scalars: no signal
    cfg.reward_key = "acc"
    assert (hub.scalar(a), hub.scalar(b)) == (1.0, 0.0)
    assert check_reward_nonzero_std(cfg, [a, b]) is True


TRAIN_RM = '''
def nan_for_odd(args, sample):
    """A dict reward whose scalar is NaN for every odd sample index."""
    ids = sample.response_ids
    value = float("nan") if sample.index % 2 else sum(t % 2 == 0 for t in ids) / max(len(ids), 1)
    return {"reward": value, "len": len(ids)}
'''


def test_nan_dict_rewards_never_reach_training(tiny_model_dir, tmp_path, monkeypatch):
    """The reported bug: one NaN dict reward turned loss, grad norm and every weight into NaN."""
    import json

    import torch

    from slick.loop.sync import train
    from tests.test_loop import make_cfg, read_jsonl

    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(4)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    name = f"slick_test_nan_train_{next(_ids)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(TRAIN_RM))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = make_cfg(tiny_model_dir, tmp_path / "p.jsonl", tmp_path / "run", num_rollout=1,
                       custom_rm_path=f"{name}.nan_for_odd")
        run = asyncio.run(train(cfg))
    finally:
        sys.modules.pop(name, None)
    (row,) = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert row["reward/nonfinite"] == 4 and row["reward/failures"] == 4      # 2 prompts x 4 samples, odd ones
    assert math.isfinite(row["train/loss"]) and math.isfinite(row["train/grad_norm"])
    assert all(torch.isfinite(w).all() for _, w in run.train_parts.trainer.named_weights())

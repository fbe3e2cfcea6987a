"""RewardHub: dispatch, overrides, custom functions by dotted path, group rm, failures, timeouts."""
import asyncio
import itertools
import logging
import sys
import textwrap
import threading

import pytest

from slick.config import Config
from slick.reward import RewardHub
from slick.types import Sample

_ids = itertools.count()

PLUGIN = '''
import asyncio, threading, time

GROUP_CALLS = []
THREADS = []
IN_FLIGHT = [0, 0]   # current, max


def sync_rm(args, sample):
    THREADS.append(threading.current_thread().name)
    if sample.response == "boom":
        raise RuntimeError("kaboom")
    if sample.response == "slow":
        time.sleep(1.5)
    if sample.response == "nan":
        return float("nan")
    if sample.response == "text":
        return "not a number"
    return float(len(sample.response))


async def async_rm(args, sample):
    IN_FLIGHT[0] += 1
    IN_FLIGHT[1] = max(IN_FLIGHT)
    try:
        await asyncio.sleep(0.05)
        if sample.response == "slow":
            await asyncio.sleep(30)
        if sample.response == "boom":
            raise KeyError("missing")
        return {"acc": 1.0 if sample.response == sample.label else 0.0, "len": len(sample.response)}
    finally:
        IN_FLIGHT[0] -= 1


def group_rm(args, samples):
    GROUP_CALLS.append([s.index for s in samples])
    if any(s.response == "boom" for s in samples):
        raise ValueError("group failed")
    # rank reward: 1.0 for the longest response in the group, 0.0 otherwise
    longest = max(len(s.response) for s in samples)
    return [1.0 if len(s.response) == longest else 0.0 for s in samples]


async def async_group_rm(args, samples):
    GROUP_CALLS.append([s.index for s in samples])
    return [float(i) for i, _ in enumerate(samples)]


def wrong_length_group_rm(args, samples):
    return [1.0]


NOT_CALLABLE = 3
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """A fresh plugin module written to tmp_path and importable by name."""
    name = f"slick_test_rm_{next(_ids)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, lambda: sys.modules[name]
    sys.modules.pop(name, None)


def make_cfg(**kw):
    kw.setdefault("rm_timeout", 5.0)
    return Config.from_flat(kw)


def samples(responses, label=None, metadata=None, group=0):
    return [Sample(index=i, group_index=group, response=r, label=label,
                   metadata=dict(metadata or {})) for i, r in enumerate(responses)]


def run(hub, *groups):
    async def go():
        try:
            for g in groups:
                await hub.score_group(g)
        finally:
            await hub.close()
    asyncio.run(go())


# ---------------------------------------------------------------- built-in dispatch

def test_builtin_types_and_metadata_override():
    hub = RewardHub(make_cfg(rm_type="gsm8k"))
    g = samples(["3 + 4 = 7", "8"], label="7")
    g += [Sample(index=2, response="\\boxed{\\frac{1}{2}}", label="0.5", metadata={"rm_type": "math"}),
          Sample(index=3, response="so \\boxed{(6+4)*5}", label={"target": 50, "numbers": [4, 5, 6]},
                 metadata={"rm_type": "boxed_countdown"}),
          Sample(index=4, response="Paris", label="paris", metadata={"rm_type": "exact"})]
    run(hub, g)
    assert [s.reward for s in g] == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert all("reward_error" not in s.metadata for s in g)
    st = hub.stats()
    assert st["reward/samples"] == 5 and st["reward/failures"] == 0 and st["reward/timeouts"] == 0


def test_bad_label_and_unknown_override_fail_only_that_sample(caplog):
    hub = RewardHub(make_cfg(rm_type="gsm8k", rm_failure_reward=-1.0))
    g = samples(["7", "7", "7"], label="7")
    g[1].label = "seven"
    g[2].metadata["rm_type"] = "nope"
    with caplog.at_level(logging.WARNING, logger="slick.reward.hub"):
        run(hub, g)
    assert [s.reward for s in g] == [1.0, -1.0, -1.0]
    assert "no number in label" in g[1].metadata["reward_error"]
    assert "unknown reward type 'nope'" in g[2].metadata["reward_error"]
    assert hub.stats()["reward/failures"] == 2
    assert "sample 1" in caplog.text and "sample 2" in caplog.text


def test_construction_errors():
    with pytest.raises(ValueError, match="unknown reward type 'bogus'"):
        RewardHub(make_cfg(rm_type="bogus"))
    with pytest.raises(ValueError, match="--rm-url"):
        RewardHub(make_cfg(rm_type="remote_rm"))
    with pytest.raises(ValueError, match="no reward configured"):
        RewardHub(make_cfg(rm_type=None))


def test_bad_custom_paths_fail_at_construction(plugin):
    name, _ = plugin
    for path, msg in [("no_such_pkg_xyz.fn", "module 'no_such_pkg_xyz' not found"),
                      (f"{name}.missing_fn", "has no function 'missing_fn'"),
                      (f"{name}.NOT_CALLABLE", "not a function"),
                      ("justaname", "not a dotted path")]:
        with pytest.raises(ValueError, match="--custom-rm-path") as e:
            RewardHub(make_cfg(custom_rm_path=path))
        assert msg in str(e.value)


# ---------------------------------------------------------------- custom functions

def test_custom_sync_runs_on_worker_threads(plugin):
    name, mod = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.sync_rm"))
    g = samples(["a", "abcd", "abc"])
    run(hub, g)
    assert [s.reward for s in g] == [1.0, 4.0, 3.0]
    assert len(mod().THREADS) == 3
    assert all(t.startswith("slick-reward") for t in mod().THREADS)
    assert threading.current_thread().name not in mod().THREADS


def test_custom_async_dict_reward_and_scalar(plugin):
    name, mod = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}:async_rm", reward_key="acc", rm_concurrency=2))
    g = samples(["x", "y", "x", "x", "z", "x"], label="x")
    run(hub, g)
    assert g[1].reward == {"acc": 0.0, "len": 1}
    assert [hub.scalar(s) for s in g] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert mod().IN_FLIGHT[1] == 2          # never more than --rm-concurrency at once
    hub.cfg.reward_key = "missing"
    with pytest.raises(KeyError, match="'missing' not in the dict reward of sample 0"):
        hub.scalar(g[0])
    hub.cfg.reward_key = None
    with pytest.raises(KeyError, match="set --reward-key"):
        hub.scalar(g[0])
    with pytest.raises(ValueError, match="no reward yet"):
        hub.scalar(Sample(index=9))


def test_raising_and_slow_custom_give_failure_reward(plugin):
    name, _ = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.sync_rm", rm_timeout=0.3, rm_failure_reward=-0.5))
    g = samples(["ok", "boom", "slow", "nan", "text", "fine!"])
    run(hub, g)
    assert [s.reward for s in g] == [2.0, -0.5, -0.5, -0.5, -0.5, 5.0]
    assert "RuntimeError: kaboom" in g[1].metadata["reward_error"]
    assert "timed out" in g[2].metadata["reward_error"]
    assert "not finite" in g[3].metadata["reward_error"]
    assert "must be a number or a dict" in g[4].metadata["reward_error"]
    assert "reward_error" not in g[0].metadata and "reward_error" not in g[5].metadata
    st = hub.stats()
    assert st["reward/failures"] == 4 and st["reward/timeouts"] == 1


def test_slow_async_custom_times_out(plugin):
    name, _ = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.async_rm", rm_timeout=0.5, reward_key="acc"))
    g = samples(["slow", "x", "boom"], label="x")
    run(hub, g)
    assert g[0].reward == 0.0 and "timed out" in g[0].metadata["reward_error"]
    assert g[1].reward == {"acc": 1.0, "len": 1}
    assert "KeyError" in g[2].metadata["reward_error"]
    assert hub.stats()["reward/timeouts"] == 1 and hub.stats()["reward/failures"] == 2


def test_rescoring_clears_old_error(plugin):
    name, _ = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.sync_rm"))
    s = Sample(index=0, response="boom")
    run(hub, [s])
    assert "reward_error" in s.metadata
    s.response = "fixed"
    run(hub, [s])
    assert s.reward == 5.0 and "reward_error" not in s.metadata


# ---------------------------------------------------------------- group rm

def test_group_rm_called_once_per_group(plugin):
    name, mod = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.group_rm", group_rm=True))
    g1 = samples(["a", "abc", "ab"], group=0)
    g2 = [Sample(index=10 + i, group_index=1, response=r) for i, r in enumerate(["xx", "xx", "x"])]
    run(hub, g1, g2)
    assert mod().GROUP_CALLS == [[0, 1, 2], [10, 11, 12]]
    assert [s.reward for s in g1] == [0.0, 1.0, 0.0]
    assert [s.reward for s in g2] == [1.0, 1.0, 0.0]
    assert hub.stats()["reward/calls"] == 2


def test_async_group_rm(plugin):
    name, mod = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.async_group_rm", group_rm=True))
    g = samples(["a", "b", "c", "d"])
    run(hub, g)
    assert [s.reward for s in g] == [0.0, 1.0, 2.0, 3.0]
    assert len(mod().GROUP_CALLS) == 1


def test_group_rm_failure_fails_whole_group_only(plugin):
    name, _ = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.group_rm", group_rm=True, rm_failure_reward=-1.0))
    bad = samples(["a", "boom"], group=0)
    good = [Sample(index=5, group_index=1, response="zz")]
    run(hub, bad, good)
    assert [s.reward for s in bad] == [-1.0, -1.0]
    assert all("group failed" in s.metadata["reward_error"] for s in bad)
    assert good[0].reward == 1.0
    assert hub.stats()["reward/failures"] == 2


def test_group_rm_wrong_length(plugin):
    name, _ = plugin
    hub = RewardHub(make_cfg(custom_rm_path=f"{name}.wrong_length_group_rm", group_rm=True))
    g = samples(["a", "b"])
    run(hub, g)
    assert all("list of 2 rewards" in s.metadata["reward_error"] for s in g)


def test_group_rm_with_builtin_scores_each():
    hub = RewardHub(make_cfg(rm_type="exact", group_rm=True))
    g = samples(["x", "y", " x "], label="x")
    run(hub, g)
    assert [s.reward for s in g] == [1.0, 0.0, 1.0]


def test_hub_survives_several_event_loops():
    hub = RewardHub(make_cfg(rm_type="exact"))
    for _ in range(2):
        g = samples(["x"], label="x")
        asyncio.run(hub.score_group(g))
        assert g[0].reward == 1.0
    asyncio.run(hub.close())

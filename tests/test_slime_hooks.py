"""slime's end-of-rollout hooks run with slime's arguments and their results used (slick/rollout/slime_hooks.py):
real LocalEngine on the tiny model, real RolloutManager."""
import pytest

from slick.compat.finder import install
from slick.data.source import DataSource

install()   # `import slime` in the plug-ins resolves to slick's stand-in, as when slick loads them
from tests import slime_hook_plugins as plug  # noqa: E402
from tests.test_loop import prompts  # noqa: E402,F401  (a fixture: prompts and the even_rm reward)
from tests.test_slime_plugins import engine, make_cfg, rollout  # noqa: E402,F401  (the engine fixture)


@pytest.fixture(autouse=True)
def fresh():
    plug.CALLS.clear()


def test_sample_filter_gets_slime_samples_and_removes_them_from_the_loss(tiny_model_dir, engine):  # noqa: F811
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=3,
                   rollout_sample_filter_path="tests.slime_hook_plugins.remove_odd_samples")
    samples, metrics, _, manager = rollout(cfg, engine)
    ((kind, n, seen),) = plug.CALLS
    assert kind == "filter" and n == 2
    assert [[i for _, i, _ in g] for g in seen] == [[0, 1], [2, 3]]
    assert all(is_slime for g in seen for is_slime, _, _ in g)
    tok = manager.tok
    assert seen[0][0][2] == tok.decode(samples[0].prompt_ids, skip_special_tokens=False)   # chat-templated text
    assert [s.metadata.get("remove_sample", False) for s in samples] == [False, True, False, True]
    assert [set(s.loss_mask) for s in samples] == [{1}, {0}, {1}, {0}]
    assert metrics["rollout/slime_removed_samples"] == 2.0


def test_all_samples_process_sees_dropped_groups_and_the_data_source(tiny_model_dir, engine):  # noqa: F811
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=2, over_sampling_batch_size=3,
                   dynamic_sampling_filter_path="tests.slime_hook_plugins.drop_group_one",
                   rollout_all_samples_process_path="tests.slime_hook_plugins.record_all")
    samples, metrics, _, manager = rollout(cfg, engine)
    ((kind, batch, groups, source),) = plug.CALLS
    assert kind == "all" and batch == 2 and isinstance(source, DataSource) and source is manager.data
    assert metrics["rollout/filtered_groups"] == 1
    assert groups == [[0, 1], [2, 3], [4, 5]]                       # group 1 was dropped, still processed
    assert [s.index for s in samples] == [0, 1, 4, 5]
    assert "rollout/slime_removed_samples" in metrics and metrics["rollout/slime_removed_samples"] == 0.0


def test_reward_post_process_gives_the_advantages(tiny_model_dir, prompts, tmp_path):  # noqa: F811
    """slime's --custom-reward-post-process-path: called with the step's samples (their rewards set); the rewards it
    returns are the advantages on every trained token."""
    import asyncio
    import json

    from slick.loop.sync import train
    from tests.test_loop import make_cfg as loop_cfg

    cfg = loop_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=1, rollout_max_response_len=4,
                   disable_rewards_normalization=True,
                   custom_reward_post_process_path="tests.slime_hook_plugins.rank_rewards",
                   save_debug_train_data=str(tmp_path / "dbg"))
    asyncio.run(train(cfg))
    ((kind, n, seen),) = [c for c in plug.CALLS if c[0] == "post"]
    assert n == 4 and [i for i, _ in seen] == list(range(8))
    rows = [json.loads(x) for x in (tmp_path / "dbg" / "train_0.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [i - 3.5 for i in range(8)]
    for r in rows:
        assert {a for a, m in zip(r["advantages"], r["loss_mask"]) if m} == {r["index"] - 3.5}
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["train/slime_raw_reward"] == sum(r for _, r in seen) / 8


@pytest.mark.parametrize("argv,problem", [
    (["--advantage-estimator", "ppo"], "--custom-reward-post-process-path with --advantage-estimator ppo"),
    (["--custom-advantage-function-path", "a.b"], "both set the advantages"),
])
def test_reward_post_process_needs_grpo(argv, problem):
    from slick.config import ConfigError
    from slick.configure import parse_config

    base = ["--custom-reward-post-process-path", "tests.slime_hook_plugins.rank_rewards"]
    assert parse_config(base, validate=False).disable_rewards_normalization is True
    with pytest.raises(ConfigError, match=problem):
        parse_config(base + argv, validate=False)



@pytest.mark.parametrize("flag", ["--rollout-sample-filter-path", "--rollout-all-samples-process-path"])
def test_end_of_rollout_hooks_are_refused_by_train_async(tiny_model_dir, tmp_path, flag):
    """slick train-async has no end of a rollout (groups stream to the trainer one by one): refused, not ignored."""
    from slick.config import ConfigError
    from slick.configure import parse_config

    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    argv = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data), flag, "tests.slime_hook_plugins.x"]
    with pytest.raises(ConfigError, match=f"{flag} is not supported by slick train-async"):
        parse_config(argv, driver="async")


def test_sample_hooks_run_before_the_reward_with_slimes_arguments(tiny_model_dir, engine):  # noqa: F811
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=3, rollout_sample_hook_path=[
        "tests.slime_hook_plugins.tag_sample", "tests.slime_hook_plugins.label_is_response"])
    samples, _, _, _ = rollout(cfg, engine)
    assert [s.metadata["hooked"] for s in samples] == [[0, False, 2]] * 4
    assert [s.label == s.response for s in samples] == [True] * 4
    assert [s.reward for s in samples] == [1.0] * 4          # rm_type exact: scored after the hooks
    assert [set(s.loss_mask) for s in samples] == [{0}, {1}, {1}, {1}]


def test_a_sample_hook_that_changes_tokens_is_refused(tiny_model_dir, engine):  # noqa: F811
    cfg = make_cfg(tiny_model_dir, rollout_max_response_len=3,
                   rollout_sample_hook_path=["tests.slime_hook_plugins.change_tokens"])
    with pytest.raises(ValueError, match="--rollout-sample-hook-path: a hook changed the sample's tokens"):
        rollout(cfg, engine)

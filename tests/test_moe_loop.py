"""A whole `slick train` run of a mixture-of-experts model with routing replay: the engine's expert choices ride on
the samples through the buffer into the trainer, whose replayed forward reproduces the engine's logprobs."""
import asyncio
import json

import pytest

from slick.loop.sync import train
from slick.models.tiny import make_tiny_model
from tests.test_loop import make_cfg, prompts  # noqa: F401 - the prompts fixture


@pytest.mark.parametrize("replay", [True, False])
def test_train_with_routing_replay_end_to_end(tmp_path, prompts, replay):  # noqa: F811
    model = make_tiny_model(tmp_path / "moe", arch="mixtral", seed=4, initializer_range=0.2)
    cfg = make_cfg(model, prompts, tmp_path / "run", num_rollout=2, use_routing_replay=replay)
    asyncio.run(train(cfg))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # the engine and the trainer hold the same weights at each step: every recorded token's experts are the
        # trainer's own top-k, with or without replay, and every sample carried its record (none with replay off)
        assert r["train/moe/mismatch"] == 0.0
        assert r["train/moe/replay_missing_samples"] == 0.0
        assert r["train/moe/load_max"] >= r["train/moe/load_mean"] > 0
        assert r["train/train_rollout_logprob_abs_diff_max"] < 1e-4

"""`slick train` with HTTP engines: real `slick serve` workers behind the real sglang-router."""
import asyncio
import json
import sys

import pytest

from slick.engines.router import router_available
from tests.test_loop import REWARD_MODULE, make_cfg, read_jsonl  # noqa: F401  (shared helpers)


@pytest.mark.slow
def test_train_through_router_with_disk_weight_sync(tiny_model_dir, tmp_path):
    if not router_available():
        pytest.fail("sglang-router is not installed (pip install -e '.[all]')")
    from slick.loop.sync import train

    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "even_rm.py").write_text(REWARD_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = make_cfg(tiny_model_dir, tmp_path / "p.jsonl", tmp_path / "run", num_rollout=2,
                       rollout_engine="http", rollout_num_workers=2, router="sglang")
        run = asyncio.run(train(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["perf/update_weights_time"] > 0 for r in rows)
    # the workers loaded the trainer's weights from disk: rollout logprobs match the trainer's (fp32)
    assert rows[-1]["train/train_rollout_logprob_abs_diff"] < 1e-3
    assert run.train_parts.trainer.version == 2
    assert (tmp_path / "run" / "weights" / "model.safetensors").is_file()

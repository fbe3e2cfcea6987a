"""`slick sft` on 2 FSDP2 trainer ranks on a real local Ray cluster (gloo): one SFT step equals the in-process
step (loss, held-out loss, the weights written by --save-hf), and no engine starts."""
import json

import pytest
import torch
from safetensors.torch import load_file

from slick.loop.sft import main
from tests.test_sft_run import _chats


def _run(model, train, test, out, *extra):
    rc = main(["--hf-checkpoint", str(model), "--prompt-data", str(train), "--rollout-batch-size", "6",
               "--micro-batch-size", "2", "--num-rollout", "1", "--lr", "1e-3", "--calculate-per-token-loss",
               "--eval-prompt-data", "test", str(test), "--eval-interval", "1", "--dtype", "fp32", "--seed", "3",
               "--run-dir", str(out / "run"), "--save-hf", str(out / "hf"), "--no-progress", "--no-rollout-store",
               *extra])
    assert rc == 0
    rows = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, load_file(str(out / "hf" / "model.safetensors"))


def test_one_sft_step_on_two_ray_ranks_equals_the_in_process_step(tiny_model_dir, tmp_path, monkeypatch):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in _chats(6, 0)))
    test.write_text("".join(json.dumps(r) + "\n" for r in _chats(3, 1)))
    monkeypatch.setattr("slick.loop.build.make_engines", lambda *a, **k: pytest.fail("SFT started an engine"))
    one_rows, one_w = _run(tiny_model_dir, train, test, tmp_path / "one")
    ray_rows, ray_w = _run(tiny_model_dir, train, test, tmp_path / "ray", "--actor-num-gpus-per-node", "2",
                           "--dist-timeout", "120", "--ray-start-timeout", "120")
    assert [r["step"] for r in ray_rows] == [r["step"] for r in one_rows] == [0, 1]   # eval before step 1, step 1
    assert ray_rows[0]["eval/test/loss"] == pytest.approx(one_rows[0]["eval/test/loss"], rel=1e-5)
    a, b = one_rows[1], ray_rows[1]
    for key in ("train/sft_loss", "train/loss", "train/grad_norm", "eval/test/loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-5), key
    assert b["eval/test/loss"] < ray_rows[0]["eval/test/loss"] - 0.1   # the step lowered the held-out loss
    assert b["train/sft_loss"] > 5.0 and b["rollout/sft_trained_tokens"] == a["rollout/sft_trained_tokens"] > 0
    assert "eval/test/token_acc" in a and "eval/test/token_acc" not in b   # the argmax needs a model in the driver
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(ray_w) == set(one_w)
    for n, w in one_w.items():
        assert float((ray_w[n] - w).abs().max()) <= 1e-5, n
    assert max(float((one_w[n] - base[n]).abs().max()) for n in base) > 5e-4   # the step moved the weights

"""End to end: a NaN reward in a replayed rollout cannot poison training, and a rollout step whose training is
all non-finite stops `slick train` before anything is synced or saved (the last checkpoint stays loadable)."""
import asyncio
import json
import math
import shutil
import sys

import pytest
import torch

from slick.loop.sync import main, train
from slick.ckpt.checkpoint import list_steps, load_checkpoint
from slick.train.trainer import Trainer
from tests.test_loop import REWARD_MODULE, make_cfg, read_jsonl

NAN_ADVANTAGE = '''
import torch
from slick.algo import AdvantageOutputs
CALLS = [0]

def advantage(inputs):
    """reward - 0.5 on every token, except on the second call (rollout step 1): NaN everywhere."""
    CALLS[0] += 1
    adv = (inputs.rewards.view(-1, 1) - 0.5) * inputs.mask
    return AdvantageOutputs(adv * float("nan") if CALLS[0] == 2 else adv, adv)
'''


@pytest.fixture()
def env(tmp_path):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(8)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "even_rm.py").write_text(REWARD_MODULE)
    (tmp_path / "nan_adv.py").write_text(NAN_ADVANTAGE)
    sys.path.insert(0, str(tmp_path))
    sys.modules.pop("nan_adv", None)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("nan_adv", None)


def _set_reward(src, dst, value):
    """Copy the saved rollouts of src to dst with sample 2 of step 0 given ``value`` as its reward."""
    shutil.copytree(src, dst)
    path = dst / "rollout_0.jsonl"
    rows = read_jsonl(path)
    assert rows[2]["index"] == 2
    rows[2]["reward"] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json writes NaN as the token NaN


def test_nan_reward_in_a_loaded_rollout_is_replaced_and_counted(tiny_model_dir, env):
    rollouts = env / "rollouts"
    asyncio.run(train(make_cfg(tiny_model_dir, env / "p.jsonl", env / "gen", num_rollout=2,
                               custom_rm_path="even_rm.even_tokens", debug_rollout_only=True,
                               save_debug_rollout_data=str(rollouts))))
    _set_reward(rollouts, env / "nan", float("nan"))
    _set_reward(rollouts, env / "same", 0.25)     # what the NaN must become: --rm-failure-reward 0.25
    runs, rows = [], []
    for name in ("nan", "same"):
        cfg = make_cfg(tiny_model_dir, env / "p.jsonl", env / f"run_{name}", num_rollout=2, rm_failure_reward=0.25,
                       custom_rm_path="even_rm.even_tokens", load_debug_rollout_data=str(env / name),
                       save_debug_train_data=str(env / f"dbg_{name}"))
        runs.append(asyncio.run(train(cfg)))
        rows.append(read_jsonl(env / f"run_{name}" / "metrics.jsonl"))
    nan_run, same_run = runs
    assert [r["train/nonfinite_rewards"] for r in rows[0]] == [1.0, 0.0]
    assert [r["train/nonfinite_rewards"] for r in rows[1]] == [0.0, 0.0]
    assert [r["train/skipped_steps"] for r in rows[0]] == [0.0, 0.0] and nan_run.train_parts.trainer.version == 2
    assert read_jsonl(env / "dbg_nan" / "train_0.jsonl")[2]["reward"] == 0.25
    for key in ("rollout/raw_reward", "train/grad_norm", "train/loss"):
        assert [r[key] for r in rows[0]] == [r[key] for r in rows[1]], key
    for (n, a), (_, b) in zip(nan_run.train_parts.trainer.named_weights(),
                              same_run.train_parts.trainer.named_weights()):
        assert torch.isfinite(a).all() and torch.equal(a, b), n


def test_all_nonfinite_step_stops_before_sync_and_save(tiny_model_dir, env, capsys):
    ckpt, hf, run_dir = env / "ckpt", env / "hf", env / "run"
    argv = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(env / "p.jsonl"),
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
            "--custom-rm-path", "even_rm.even_tokens", "--custom-advantage-function-path", "nan_adv.advantage",
            "--lr", "1e-3", "--num-rollout", "3", "--dtype", "fp32", "--micro-batch-size", "4",
            "--run-dir", str(run_dir), "--no-progress", "--save", str(ckpt), "--save-interval", "1",
            "--save-hf", str(hf)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "slick train: error: step 1: training is non-finite: all 1 optimizer step(s) skipped " \
           "(non-finite loss in 2 micro-batch(es)" in err
    import nan_adv
    assert nan_adv.CALLS == [2]                              # step 2 never ran
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == [1]
    assert list_steps(ckpt) == [1] and (ckpt / "latest").read_text() == "1\n"
    tr = Trainer(make_cfg(tiny_model_dir, env / "p.jsonl", env / "unused"))
    assert load_checkpoint(ckpt, tr)[0] == 1 and tr.version == 1
    from safetensors.torch import load_file
    exported = load_file(str(hf / "model.safetensors"))     # the export of step 1, not overwritten
    for n, w in tr.named_weights():
        assert torch.isfinite(w).all() and torch.equal(exported[n], w), n
    assert not math.isnan(read_jsonl(run_dir / "metrics.jsonl")[0]["train/grad_norm"])

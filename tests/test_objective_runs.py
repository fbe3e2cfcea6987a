"""The --policy-loss objectives and DAPO's length shaping in real runs with a tiny random model: `slick train`
(the CLI, a real process) with CISPO for 2 steps, slick train-async with SAPO and --use-tis, and the start-up
refusals of combinations the references do not define."""
import asyncio
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slick.algo.shaping import overlong_penalty
from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.algo.objective import zero_gradient
from slick.loop.shaping import shape_for_training
from slick.loop.sync import train
from slick.loop.train_async import train_async
from slick.types import Sample, Status
from tests.test_loop import make_cfg, prompts, read_jsonl  # noqa: F401 - prompts is a fixture
from tests.algo_params import params
from tests.test_loop_async import make_async_cfg

ROOT = Path(__file__).resolve().parents[1]


def test_slick_train_cli_trains_cispo_for_two_steps(tiny_model_dir, prompts, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{prompts.parent}{os.pathsep}{ROOT}"}
    cmd = [sys.executable, "-m", "slick.cli", "train", "--hf-checkpoint", str(tiny_model_dir), "--prompt-data",
           str(prompts), "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "8",
           "--custom-rm-path", "even_rm.even_tokens", "--lr", "1e-3", "--dtype", "fp32", "--run-dir", str(run),
           "--no-progress", "--num-rollout", "2", "--policy-loss", "cispo", "--cispo-eps-high", "4.0",
           "--num-steps-per-rollout", "2", "--overlong-buffer-len", "4"]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [m for m in read_jsonl(run / "metrics.jsonl") if "train/pg_loss" in m]
    assert [m["step"] for m in rows] == [1, 2]
    for m in rows:
        assert math.isfinite(m["train/pg_loss"]) and m["train/grad_norm"] > 0
        assert 0.0 <= m["train/pg_clipfrac"] <= 1.0 and "train/ppo_kl" in m
        # 8-token limit, 4-token buffer: every response of 5+ tokens is penalised (-1 at 8 tokens)
        assert -1.0 <= m["train/overlong_penalty"] < 0 and m["train/overlong_frac"] > 0
        assert "train/truncated_masked" not in m
    assert "policy_loss: cispo" in (run / "config.yaml").read_text()


def test_train_async_with_tis_trains_sapo(tiny_model_dir, prompts, tmp_path):
    cfg = make_async_cfg(tiny_model_dir, prompts, tmp_path / "run", max_staleness=1, num_rollout=3,
                         policy_loss="sapo", high_entropy_token_ratio=0.5, use_mis=True)
    asyncio.run(train_async(cfg))
    rows = [m for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/pg_loss" in m]
    assert len(rows) == 3
    for m in rows:
        assert 0.0 < m["train/sapo_gate_mean"] < 4.0 / 1.0 and "train/tis_mean" in m and "train/mis_maskfrac" in m
        assert m["train/entropy_keepfrac"] == pytest.approx(0.5, abs=0.25) and m["train/entropy_kept"] > 0


def test_lora_trains_kl_cov(tiny_model_dir, prompts, tmp_path):
    cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=2, lora_rank=4, lr=1e-2,
                   policy_loss="kl_cov", kl_cov_ratio=0.05, ppo_kl_coef=1.0)
    run = asyncio.run(train(cfg))
    rows = [m for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "train/pg_loss" in m]
    assert len(rows) == 2 and run.train_parts.trainer.lora is not None
    for m in rows:   # 2 x 4 samples of up to 8 tokens: max(1, int(0.05 x tokens)) = 1 or 2 tokens penalised
        assert 0.0 < m["train/kl_cov_frac"] <= 0.25 and m["train/grad_norm"] > 0


def test_batch_coupled_objectives_train_zero_advantage_samples():
    zero = [0.0, 0.0, 0.0]
    assert zero_gradient(params(), zero) and zero_gradient(params(policy_loss="cispo"), zero)
    for over in (dict(policy_loss="kl_cov"), dict(policy_loss="clip_cov"), dict(high_entropy_token_ratio=0.2)):
        assert not zero_gradient(params(**over), zero), over


def _problems(**over):
    values = dict(hf_checkpoint=None, prompt_data=None, rollout_max_response_len=16)
    values.update(over)
    with pytest.raises(ConfigError) as e:
        validate_config(Config.from_flat(values), check_files=False)
    return str(e.value)


@pytest.mark.parametrize("over,words", [
    (dict(policy_loss="cispo", sapo_tau_pos=2.0), "--sapo-tau-pos configures --policy-loss sapo, but the run trains "
                                                  "cispo"),
    (dict(policy_loss="sapo", calculate_per_token_loss=True), "--policy-loss sapo is defined with a per-sequence"),
    (dict(policy_loss="gmpo", calculate_per_token_loss=True), "--policy-loss gmpo is defined with a per-sequence"),
    (dict(policy_loss="gmpo", advantage_estimator="ppo"), "--policy-loss gmpo takes one advantage per sequence"),
    (dict(policy_loss="gmpo", use_mis=True), "--policy-loss gmpo with --use-mis is not defined"),
    (dict(policy_loss="gpg", eps_clip_c=3.0), "--eps-clip-c (dual clip) belongs to PPO's clipped loss"),
    (dict(use_opsm=True), "--use-opsm masks by the KL between the old policy and the current one"),
    (dict(opsm_delta=0.5), "--opsm-delta is the threshold of --use-opsm, which is off"),
    (dict(high_entropy_token_ratio=0.0), "--high-entropy-token-ratio must be in (0, 1]"),
    (dict(overlong_buffer_len=17), "--overlong-buffer-len must be in 1..--rollout-max-response-len (16)"),
    (dict(overlong_penalty_factor=2.0), "--overlong-penalty-factor is the penalty of --overlong-buffer-len"),
    (dict(policy_loss="clip_cov", clip_cov_lb=5.0), "--clip-cov-lb 5.0 must be below --clip-cov-ub 5.0"),
    (dict(policy_loss="nope"), "unknown --policy-loss 'nope'"),
])
def test_undefined_combinations_are_refused_by_name(over, words):
    assert words in _problems(**over)


def test_defined_combinations_pass():
    for over in (dict(policy_loss="gmpo", use_tis=True), dict(advantage_estimator="gspo", eps_clip_c=3.0),
                 dict(use_opsm=True, use_rollout_logprobs=True, opsm_delta=0.01),
                 dict(policy_loss="kl_cov", kl_cov_ratio=0.01, ppo_kl_coef=1.0)):
        cfg = validate_config(Config.from_flat(dict(rollout_max_response_len=16, **over)), check_files=False)
        assert all(getattr(cfg, k) == v for k, v in over.items())


def test_overlong_penalty_by_hand():
    # L_max 100, buffer 20, factor 1: free up to 80 tokens, then -1/20 per token, -1 at 100
    assert [overlong_penalty(n, 100, 20, 1.0) for n in (50, 80, 90, 100)] == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(95, 100, 20, 0.5) == pytest.approx(-0.375)
    with pytest.raises(ValueError, match="overlong buffer length must be in 1..100"):
        overlong_penalty(10, 100, 0, 1.0)


def test_shape_for_training_masks_truncated_samples_without_changing_them():
    cfg = Config.from_flat(dict(rollout_max_response_len=10, overlong_buffer_len=4, mask_truncated=True))
    done = Sample(index=0, response_ids=[1] * 5, loss_mask=[1] * 5, status=Status.COMPLETED)
    cut = Sample(index=1, response_ids=[1] * 10, loss_mask=[1] * 8 + [0, 1], status=Status.TRUNCATED)
    samples, rewards, m = shape_for_training(cfg, [done, cut], [1.0, 1.0])
    assert rewards == [1.0, 0.0]            # 5 tokens: free (limit 10 - 4); 10 tokens: -1
    assert samples[0] is done and samples[1].loss_mask == [0] * 10 and cut.loss_mask == [1] * 8 + [0, 1]
    assert m == {"train/overlong_penalty": -0.5, "train/overlong_frac": 0.5, "train/truncated_masked": 1.0}


def _fsdp_cfg(model_dir, name):
    from tests.test_train import make_cfg as make_train_cfg
    return make_train_cfg(model_dir, lr=1e-3, micro_batch_size=2, clip_grad=1.0, eps_clip=0.2, use_kl_loss=True,
                          kl_loss_coef=0.1, policy_loss=name)


def _rank_objective_step(rank, world, model_dir, name):
    from slick.train.trainer import Trainer
    from tests.test_train_fsdp import batch, one_step
    cfg = _fsdp_cfg(model_dir, name)
    return one_step(Trainer(cfg), cfg, batch())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cispo", "sapo"])
def test_two_fsdp_ranks_equal_one_process(tiny_model_dir, tmp_path, name):
    """Two FSDP2 ranks (real gloo processes) take the same step as one process with CISPO and SAPO: the loss and
    its metrics sum over ranks to the single process's (1e-5), and so do the updated weights (1e-4, below)."""
    from slick.train.trainer import Trainer
    from tests.test_train_fsdp import batch, one_step, run_ranks
    ranks = run_ranks(_rank_objective_step, 2, (str(tiny_model_dir), name), tmp_path)
    cfg = _fsdp_cfg(tiny_model_dir, name)
    want = one_step(Trainer(cfg), cfg, batch())
    m, w = ranks[0]["metrics"], want["metrics"]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]
    for k in ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss", "grad_norm"):
        assert m[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), k
    if name == "sapo":
        assert m["sapo_gate_mean"] == pytest.approx(w["sapo_gate_mean"], rel=1e-5)
    else:
        assert m["pg_clipfrac"] > 0
    # AdamW's first update is about lr * g / |g| = 1e-3 per entry, whatever |g|: an entry whose gradient is ~1e-8
    # moves by a summation-order-sensitive fraction of it (measured: 2.1e-5 for CISPO); a wrong sign would be 2e-3
    for n, t in want["weights"].items():
        assert max(float((r["weights"][n] - t).abs().max()) for r in ranks) <= 1e-4, n

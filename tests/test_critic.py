"""PPO's critic (slick/train/critic.py): values per response token, the value loss falls, tool tokens get no value
loss, checkpoints resume exactly, --critic-load, flag refusals, and `slick train` / `train-async` PPO runs."""
import asyncio
import json
import random
import sys

import pytest
import torch

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint
from slick.train.critic import Critic, value_objective, with_critic
from slick.train.heads import critic_source
from slick.types import Sample
from tests.batches import value_batch


def make_cfg(model_dir, **kw):
    base = dict(hf_checkpoint=str(model_dir), dtype="fp32", device="cpu", lr=1e-3, micro_batch_size=2,
                clip_grad=1.0, seed=7, rm_type="exact", advantage_estimator="ppo", critic_lr=1e-3)
    base.update(kw)
    return validate_config(Config.from_flat(base), check_files=False)


def make_samples(n=6, seed=0, vocab=1000, tool_tokens=False):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))]
        r = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
        mask = [1] * len(r)
        if tool_tokens:   # a tool answer in the middle of the response: loss mask 0
            mask[1:3] = [0, 0]
        out.append(Sample(index=i, prompt_ids=p, response_ids=r, loss_mask=mask))
    return out


def targets_for(samples, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(len(s.response_ids), generator=g) * 2 - 1 for s in samples]


@pytest.fixture(scope="module")
def critic(tiny_model_dir):
    return Critic(make_cfg(tiny_model_dir))


def test_values_per_response_token_equal_unpacked_forward(critic):
    """One value per response token, read from the hidden state that predicts it; packed == one sample at a time."""
    samples = make_samples(5)
    fresh = critic.compute_values(samples)
    assert [len(v) for v in fresh] == [len(s.response_ids) for s in samples]
    assert all(torch.equal(v, torch.zeros(len(v))) for v in fresh)   # zero-initialised head: V = 0
    head = critic.model.head
    saved = (head.weight.detach().clone(), head.bias.detach().clone())
    try:
        with torch.no_grad():
            head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0)))
            head.bias.fill_(0.25)
            values = critic.compute_values(samples)
            for s, v in zip(samples, values):
                ids = torch.tensor([s.prompt_ids + s.response_ids[:-1]])
                hidden = critic.model.backbone(input_ids=ids).last_hidden_state[0, len(s.prompt_ids) - 1:]
                torch.testing.assert_close(v, head(hidden).squeeze(-1), rtol=1e-5, atol=1e-5)
    finally:
        with torch.no_grad():
            head.weight.copy_(saved[0])
            head.bias.copy_(saved[1])


def test_value_loss_falls_on_a_fixed_batch(tiny_model_dir):
    """12 critic steps on one batch (targets in [-1, 1]; a clip of 10 never binds): the value loss ends below a
    tenth of its first value (measured: 0.16 -> 0.003)."""
    cfg = make_cfg(tiny_model_dir, critic_lr=3e-3, value_clip=10.0)
    c = Critic(cfg)
    samples = make_samples(6)
    returns = targets_for(samples)
    old = [torch.zeros(len(s.response_ids)) for s in samples]
    losses = []
    for _ in range(12):
        m = c.train_step(value_batch(samples, returns, old), value_objective(cfg))
        losses.append(m["value_loss"])
        assert m["skipped_steps"] == 0.0 and m["grad_norm"] > 0 and m["vf_clipfrac"] == 0.0
    assert losses[-1] < 0.1 * losses[0], losses
    assert c.version == 12


def test_tool_tokens_get_no_value_loss(tiny_model_dir):
    """Returns at loss-mask-0 positions (tool tokens) change neither the loss nor the update."""
    samples = make_samples(4, tool_tokens=True)
    returns = targets_for(samples)
    other = [r.clone() for r in returns]
    for r in other:
        r[1:3] = 100.0    # only at the tool tokens
    cfg = make_cfg(tiny_model_dir)
    a, b = Critic(cfg), Critic(cfg)
    zeros = [torch.zeros(len(s.response_ids)) for s in samples]
    ma, mb = a.train_step(value_batch(samples, returns, zeros), value_objective(cfg)), b.train_step(value_batch(samples, other, zeros), value_objective(cfg))
    assert ma["value_loss"] == mb["value_loss"] and ma["grad_norm"] == mb["grad_norm"]
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(p, q), n
    # and a return off at a counted token does change them
    counted = [r.clone() for r in returns]
    counted[0][0] += 1.0
    c = Critic(cfg)
    assert c.train_step(value_batch(samples, counted, zeros), value_objective(cfg))["value_loss"] != ma["value_loss"]


def test_checkpoint_resume_is_exact(tiny_model_dir, tmp_path):
    """2 steps, save (critic/ inside the step dir), resume in a new critic: the 3rd step's loss and values equal an
    uninterrupted 3rd step's exactly; the optimizer and warm-up state come back too."""
    from slick.train.trainer import Trainer

    cfg = make_cfg(tiny_model_dir, critic_lr_warmup_iters=4)
    samples = make_samples(6)
    returns = [targets_for(samples, seed=k) for k in range(3)]
    trainer, critic = Trainer(cfg), Critic(cfg)
    for k in range(2):
        critic.train_step(value_batch(samples, returns[k], critic.compute_values(samples)), value_objective(cfg))
    step_dir = save_checkpoint(tmp_path / "ckpt", 2, with_critic(trainer, critic), {"step": 2})
    assert (step_dir / "critic" / "value_head.safetensors").is_file()
    old = critic.compute_values(samples)
    m3 = critic.train_step(value_batch(samples, returns[2], old), value_objective(cfg))
    v3 = critic.compute_values(samples)

    trainer2, critic2 = Trainer(cfg), Critic(cfg)
    step, state = load_checkpoint(tmp_path / "ckpt", with_critic(trainer2, critic2))
    assert step == 2 and critic2.version == 2
    old2 = critic2.compute_values(samples)
    assert all(torch.equal(x, y) for x, y in zip(old, old2))
    m3b = critic2.train_step(value_batch(samples, returns[2], old2), value_objective(cfg))
    for key in ("value_loss", "vf_clipfrac", "values_mean", "returns_mean", "grad_norm", "lr"):
        assert m3[key] == m3b[key], key
    assert all(torch.equal(x, y) for x, y in zip(v3, critic2.compute_values(samples)))
    # a checkpoint without a critic is refused by a PPO run, naming the directory
    save_checkpoint(tmp_path / "plain", 1, trainer, {})
    with pytest.raises(FileNotFoundError, match="no critic/"):
        load_checkpoint(tmp_path / "plain", with_critic(trainer2, critic2))
    # --critic-load of the saved step dir (or its critic/) starts a critic with those weights
    assert critic_source(step_dir)[1] == step_dir / "critic" / "value_head.safetensors"
    loaded = Critic(make_cfg(tiny_model_dir, critic_load=str(step_dir)))
    assert all(torch.equal(x, y) for x, y in zip(old, loaded.compute_values(samples)))


def test_critic_flags_need_ppo(tiny_model_dir):
    for flag, value in (("value_clip", 0.5), ("critic_lr", 1e-5), ("num_critic_only_steps", 2),
                        ("critic_lr_warmup_iters", 3), ("critic_num_steps_per_rollout", 2),
                        ("critic_load", str(tiny_model_dir))):
        with pytest.raises(ConfigError, match=f"--{flag.replace('_', '-')} configures PPO's critic"):
            make_cfg(tiny_model_dir, advantage_estimator="grpo", **{flag: value})
    with pytest.raises(ConfigError, match="--critic-num-steps-per-rollout 3 does not divide"):
        make_cfg(tiny_model_dir, critic_num_steps_per_rollout=3, rollout_batch_size=2, n_samples_per_prompt=4)
    with pytest.raises(ConfigError, match="--value-clip must be > 0"):
        make_cfg(tiny_model_dir, value_clip=0.0)
    with pytest.raises(ConfigError, match="--critic-load: directory not found"):
        make_cfg(tiny_model_dir, critic_load="/nonexistent/critic")


# ---------------------------------------------------------------------------------------------- runs
REWARD_MODULE = "def even_tokens(args, sample):\n    return float(len(sample.response_ids) % 2 == 0)\n"
CRITIC_KEYS = ("critic/value_loss", "critic/vf_clipfrac", "critic/explained_variance", "critic/values_mean",
               "critic/returns_mean", "critic/grad_norm")


@pytest.fixture
def prompts(tmp_path):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(8)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "even_rm_critic.py").write_text(REWARD_MODULE)
    sys.path.insert(0, str(tmp_path))
    yield path
    sys.path.remove(str(tmp_path))


def run_cfg(model_dir, prompts, run_dir, **over):
    values = dict(hf_checkpoint=str(model_dir), prompt_data=str(prompts), rollout_batch_size=2,
                  n_samples_per_prompt=2, rollout_max_response_len=6, custom_rm_path="even_rm_critic.even_tokens",
                  lr=1e-3, num_rollout=3, dtype="fp32", run_dir=str(run_dir), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4, advantage_estimator="ppo", critic_lr=1e-3)
    values.update(over)
    return validate_config(Config.from_flat(values))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_slick_train_ppo_with_critic_only_steps(tiny_model_dir, prompts, tmp_path):
    """`slick train --advantage-estimator ppo --num-critic-only-steps 1`: every step logs the critic metrics; the
    actor first steps at step 2 (so the engines get version 1 then); the checkpoint holds the critic."""
    from slick.loop.sync import train

    cfg = run_cfg(tiny_model_dir, prompts, tmp_path / "run", num_critic_only_steps=1, critic_num_steps_per_rollout=2,
                  save=str(tmp_path / "ckpt"))
    run = asyncio.run(train(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        for key in CRITIC_KEYS:
            assert key in r and r[key] == r[key], (key, r)   # present and not NaN
    assert "train/loss" not in rows[0] and "perf/update_weights_time" not in rows[0]   # critic only
    assert "train/loss" in rows[1] and "perf/update_weights_time" in rows[1]
    trainer, critic = run.train_parts.trainer, run.train_parts.critic
    assert trainer.version == 2 and critic.version == 6   # 2 actor steps; 3 x 2 critic steps
    assert asyncio.run(run.rollout_parts.engines.engine.get_weight_version()) == 2
    assert (tmp_path / "ckpt" / "step_000003" / "critic" / "trainer_state.json").is_file()


def test_train_async_ppo(tiny_model_dir, prompts, tmp_path):
    """`slick train-async` with PPO: values are computed when a batch is trained; critic metrics every step."""
    from slick.loop.train_async import train_async

    values = dict(hf_checkpoint=str(tiny_model_dir), prompt_data=str(prompts), rollout_batch_size=2,
                  n_samples_per_prompt=2, rollout_max_response_len=6, custom_rm_path="even_rm_critic.even_tokens",
                  lr=1e-3, num_rollout=3, dtype="fp32", run_dir=str(tmp_path / "run"), no_progress=True, seed=3,
                  micro_batch_size=4, advantage_estimator="ppo", max_staleness=1, use_tis=True)
    cfg = validate_config(Config.from_flat(values), driver="async")
    run = asyncio.run(train_async(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(key in r for r in rows for key in CRITIC_KEYS)
    assert run.train_parts.critic.version == 3 and run.train_parts.trainer.version == 3


def test_critic_load_that_is_no_model_is_named(tiny_model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"--critic-load {tmp_path}: neither a Hugging Face model"):
        Critic(make_cfg(tiny_model_dir, critic_load=str(tmp_path)))
    (tmp_path / "dcp").mkdir()
    with pytest.raises(ValueError, match="sharded .* critic checkpoint cannot initialise"):
        Critic(make_cfg(tiny_model_dir, critic_load=str(tmp_path)))

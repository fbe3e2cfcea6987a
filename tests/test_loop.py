"""End-to-end synchronous RL with a tiny random model: the real engine, trainer, buffer, checkpoints."""
import asyncio
import json
import re
import sys
import textwrap

import pytest
import torch

from transformers import AutoModelForCausalLM, AutoTokenizer

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.data import PromptDataset
from slick.data.source import epoch_order
from slick.loop.sync import train
from slick.models.tiny import make_tiny_model

REWARD_MODULE = textwrap.dedent('''
    def even_tokens(args, sample):
        """Fraction of response tokens with an even id (about 0.5 for a random model): a cheap, varied reward."""
        ids = sample.response_ids
        return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)
''')


@pytest.fixture()
def prompts(tmp_path):
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(12)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "even_rm.py").write_text(REWARD_MODULE)
    sys.path.insert(0, str(tmp_path))
    yield path
    sys.path.remove(str(tmp_path))


def make_cfg(model_dir, prompts, run_dir, **over):
    values = dict(hf_checkpoint=str(model_dir), prompt_data=str(prompts), rollout_batch_size=2,
                  n_samples_per_prompt=4, rollout_max_response_len=8, custom_rm_path="even_rm.even_tokens",
                  lr=1e-3, num_rollout=3, dtype="fp32", run_dir=str(run_dir), no_progress=True, seed=3,
                  rollout_seed=5, micro_batch_size=4)
    values.update(over)
    return validate_config(Config.from_flat(values))


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sync_steps_train_and_sync(tiny_model_dir, prompts, tmp_path):
    before = {k: v.clone() for k, v in _weights(tiny_model_dir).items()}
    cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run", save_debug_train_data=str(tmp_path / "dbg"))
    run = asyncio.run(train(cfg))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["train/loss"])) for r in rows)
    after = dict(run.train_parts.trainer.named_weights())
    assert any(not torch.equal(before[k], after[k].float()) for k in before)
    assert run.train_parts.trainer.version == 3
    assert asyncio.run(run.rollout_parts.engines.engine.get_weight_version()) == 3  # the engine got the new weights
    assert rows[-1]["train/train_rollout_logprob_abs_diff"] < 1e-3  # engine and trainer agree (fp32)
    dump = read_jsonl(tmp_path / "dbg" / "train_2.jsonl")
    assert len(dump) == 8 and all(len(d["advantages"]) == len(d["loss_mask"]) for d in dump)
    # no shuffle: step k trains on prompts 2k and 2k + 1, 4 samples each, in group order
    assert [d["prompt_index"] for d in dump] == [4] * 4 + [5] * 4
    assert [d["index"] for d in dump] == list(range(16, 24))


def _weights(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _prompt_indices(debug_dir, step):
    return [d["prompt_index"] for d in read_jsonl(debug_dir / f"train_{step}.jsonl")]


def test_resume_continues_with_same_prompts(tiny_model_dir, prompts, tmp_path):
    common = dict(rollout_shuffle=True)
    full = make_cfg(tiny_model_dir, prompts, tmp_path / "full", num_rollout=4,
                    save_debug_train_data=str(tmp_path / "d_full"), **common)
    asyncio.run(train(full))
    first = make_cfg(tiny_model_dir, prompts, tmp_path / "a", num_rollout=2, save=str(tmp_path / "ckpt"),
                     save_interval=2, save_debug_train_data=str(tmp_path / "d_a"), **common)
    asyncio.run(train(first))
    resumed = make_cfg(tiny_model_dir, prompts, tmp_path / "b", num_rollout=4, load=str(tmp_path / "ckpt"),
                       save_debug_train_data=str(tmp_path / "d_b"), **common)
    run = asyncio.run(train(resumed))
    assert run.steps.start == 2
    order = epoch_order(12, 0, shuffle=True, seed=5)  # the DataSource's order for --rollout-seed 5
    assert order != list(range(12))
    for step in (0, 1, 2, 3):
        want = [order[2 * step]] * 4 + [order[2 * step + 1]] * 4
        assert _prompt_indices(tmp_path / "d_full", step) == want
        assert _prompt_indices(tmp_path / ("d_a" if step < 2 else "d_b"), step) == want
    assert [r["step"] for r in read_jsonl(tmp_path / "b" / "metrics.jsonl")] == [3, 4]


@pytest.mark.parametrize("with_checkpoints", [True, False])
def test_hf_export_reloads_with_identical_logits(tiny_model_dir, prompts, tmp_path, with_checkpoints):
    """--save-hf writes the final model, with --save (at each save) or without it (at the end of the run)."""
    from transformers import AutoModelForCausalLM

    ckpt = str(tmp_path / "ckpt") if with_checkpoints else None
    cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=2, save=ckpt, save_interval=1,
                   save_hf=str(tmp_path / "hf"))
    run = asyncio.run(train(cfg))
    assert run.train_parts.trainer.version == 2
    assert (tmp_path / "ckpt").is_dir() == with_checkpoints
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        a = reloaded(ids).logits
        b = run.train_parts.trainer.model(ids).logits.float()
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("flag", ["save", "save_hf"])
def test_saving_without_a_trainer_is_refused_up_front(tiny_model_dir, prompts, tmp_path, flag):
    with pytest.raises(ConfigError, match=f"--{flag.replace('_', '-')} needs a trainer, but --debug-rollout-only"):
        make_cfg(tiny_model_dir, prompts, tmp_path / "run", debug_rollout_only=True, **{flag: str(tmp_path / "out")})
    assert not (tmp_path / "out").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_offload_rollout_frees_the_engine_and_changes_nothing(tiny_model_dir, prompts, tmp_path):
    """--offload-rollout: the same run, metric for metric and weight for weight, with the engine's KV cache and
    packed weights freed during every training phase (and refilled by every sync; version 3 after 3 steps)."""
    plain = asyncio.run(train(make_cfg(tiny_model_dir, prompts, tmp_path / "a", offload_rollout=False)))
    off = asyncio.run(train(make_cfg(tiny_model_dir, prompts, tmp_path / "b", offload_rollout=True)))
    rows_a, rows_b = read_jsonl(tmp_path / "a" / "metrics.jsonl"), read_jsonl(tmp_path / "b" / "metrics.jsonl")
    keys = [k for k in rows_a[0] if k.startswith(("rollout/", "train/")) and not k.endswith(("_time", "per_sec"))]
    assert len(keys) > 15
    # r.get: the mismatch probe's keys are in the first step's row only (--mismatch-probe-interval 10)
    assert [[r.get(k) for k in keys] for r in rows_a] == [[r.get(k) for k in keys] for r in rows_b]
    wa, wb = dict(plain.train_parts.trainer.named_weights()), dict(off.train_parts.trainer.named_weights())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    model = off.rollout_parts.engines.engine.model
    packed_mb = sum(op.packed.numel() * op.packed.element_size() for op in model.dense_ops()
                    if op.packed is not None) / 2**20
    assert model.packed and packed_mb > 0
    assert all(r["perf/offload_freed_mb"] > packed_mb for r in rows_b)   # the packed copies and a KV cache
    assert "perf/offload_freed_mb" not in rows_a[0]
    assert off.rollout_parts.engines.engine.cache.nbytes() == 0   # freed by the last step, not regrown
    assert asyncio.run(off.rollout_parts.engines.engine.get_weight_version()) == 3


@pytest.mark.parametrize("over, message", [
    (dict(debug_train_only=True), "needs the weight sync after each step to refill the engine; --debug-train-only"),
    (dict(rollout_engine="http", rollout_urls=["http://127.0.0.1:1"]),
     "frees the in-process engine's memory; --rollout-engine http engines run in processes of their own"),
])
def test_offload_rollout_is_refused_where_no_sync_refills_the_engine(tiny_model_dir, prompts, tmp_path, over,
                                                                      message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_cfg(tiny_model_dir, prompts, tmp_path / "run", offload_rollout=True, **over)


def test_offload_rollout_is_refused_by_train_async(tiny_model_dir, prompts, tmp_path):
    cfg = Config.from_flat(dict(hf_checkpoint=str(tiny_model_dir), prompt_data=str(prompts), offload_rollout=True))
    with pytest.raises(ConfigError, match="--offload-rollout is for slick train: in slick train-async"):
        validate_config(cfg, driver="async")


TARGET_RM = textwrap.dedent('''
    import os
    TARGET = int(os.environ["SLICK_TEST_TARGET"])

    def first_token_is_target(args, sample):
        """1 when the response starts with the target token."""
        return float(sample.response_ids[:1] == [TARGET])
''')


def learnable_task(tmp_path, monkeypatch):
    """(model dir, prompts file) of a task a tiny policy learns in a dozen steps: start the response with the token
    it picks, on average, first (well under half the time at first); ``target_rm.first_token_is_target`` scores it."""
    model = make_tiny_model(tmp_path / "peaky", tie_word_embeddings=False, lm_head_std=0.5, seed=1)
    rows = [{"prompt": f"question {i}: say something", "label": str(i)} for i in range(8)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    dataset = PromptDataset(str(tmp_path / "p.jsonl"), AutoTokenizer.from_pretrained(str(model)))
    with torch.no_grad():  # the target: the token most likely, on average, to start a response
        probs = torch.stack([hf(torch.tensor([r["prompt_ids"]])).logits[0, -1].softmax(-1) for r in dataset])
    target = int(probs.mean(0).argmax())
    assert probs[:, target].mean() < 0.4
    monkeypatch.setenv("SLICK_TEST_TARGET", str(target))
    (tmp_path / "target_rm.py").write_text(TARGET_RM)
    monkeypatch.syspath_prepend(str(tmp_path))
    return model, tmp_path / "p.jsonl"


def test_tiny_model_learns_to_emit_a_given_token(tmp_path, monkeypatch):
    """A tiny policy learns to start its response with a given token it picks well under half the time at first."""
    model, _ = learnable_task(tmp_path, monkeypatch)
    cfg = make_cfg(model, tmp_path / "p.jsonl", tmp_path / "run", num_rollout=12, rollout_batch_size=4,
                   n_samples_per_prompt=8, rollout_max_response_len=4, lr=1e-3,
                   custom_rm_path="target_rm.first_token_is_target")
    asyncio.run(train(cfg))
    rewards = [r["rollout/raw_reward"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    assert rewards[0] < 0.5 and sum(rewards[-4:]) / 4 > 0.95, rewards

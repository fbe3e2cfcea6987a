"""Checkpoints: save/load round trip (weights, optimizer, RNG), interrupted saves, HF export, weight sync."""
import asyncio
import random

import numpy as np
import pytest
import torch

from slick.ckpt import checkpoint as ckpt
from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint, save_hf
from slick.train.trainer import Trainer
from slick.weights.sync import sync_weights
from tests.test_train import make_cfg, make_samples, simple_loss
from tests.batches import batch_of


def _step(tr, samples):
    return tr.train_step(batch_of(samples, [torch.ones(len(s.response_ids)) for s in samples]), simple_loss)


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_save_load_round_trip(tiny_model_dir, tmp_path):
    samples = make_samples(4)
    a = Trainer(make_cfg(tiny_model_dir, lr=1e-2, lr_warmup_steps=3))
    _step(a, samples)
    _step(a, samples)
    state = {"cursor": 17, "buffer": [{"index": 1}], "metrics_step": 2}
    path = save_checkpoint(tmp_path / "ck", 2, a, state)
    assert path.name == "step_000002" and (tmp_path / "ck" / "latest").read_text().strip() == "2"
    expected_draws = _draws()
    m_a = _step(a, samples)

    b = Trainer(make_cfg(tiny_model_dir, lr=1e-2, lr_warmup_steps=3, seed=99))
    step, st = load_checkpoint(tmp_path / "ck", b)
    assert (step, st) == (2, state) and b.version == 2
    assert _draws() == expected_draws                     # RNG restored
    m_b = _step(b, samples)                               # same optimizer state + scheduler -> same step
    assert m_b["lr"] == m_a["lr"]
    for (n, wa), (_, wb) in zip(a.named_weights(), b.named_weights()):
        assert torch.equal(wa, wb), n
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)


def test_bf16_scheme_saves_fp32_master(tiny_model_dir, tmp_path):
    a = Trainer(make_cfg(tiny_model_dir, dtype="bf16", lr=1e-3), precision="bf16")
    _step(a, make_samples(3))
    save_checkpoint(tmp_path, 1, a, {})
    b = Trainer(make_cfg(tiny_model_dir, dtype="bf16", lr=1e-3), precision="bf16")
    load_checkpoint(tmp_path, b)
    for ma, mb in zip(a.master, b.master):
        assert mb.dtype == torch.float32 and torch.equal(ma, mb)
    for (_, pa), (_, pb) in zip(a.named_weights(), b.named_weights()):
        assert pb.dtype == torch.bfloat16 and torch.equal(pa, pb)


def test_interrupted_save_keeps_previous_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    root = tmp_path / "ck"
    tr = Trainer(make_cfg(tiny_model_dir, lr=1e-2))
    samples = make_samples(3)
    _step(tr, samples)
    save_checkpoint(root, 1, tr, {"step": 1})
    saved = {n: w.clone() for n, w in tr.named_weights()}
    _step(tr, samples)

    real_save = torch.save

    def failing_save(obj, f, *a, **k):
        if str(f).endswith("optimizer.pt"):
            raise OSError("disk full (simulated)")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(root, 2, tr, {"step": 2})
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]   # temp dir cleaned up

    # crash between the directory rename and the 'latest' update
    def failing_latest(path, text):
        raise OSError("killed before latest (simulated)")

    monkeypatch.setattr(ckpt, "write_text_atomic", failing_latest)
    with pytest.raises(OSError, match="simulated"):
        save_checkpoint(root, 3, tr, {"step": 3})
    monkeypatch.undo()

    fresh = Trainer(make_cfg(tiny_model_dir, lr=1e-2))
    step, state = load_checkpoint(root, fresh)
    assert (step, state) == (1, {"step": 1})
    for n, w in fresh.named_weights():
        assert torch.equal(w, saved[n]), n
    # the complete step 3 dir is still loadable explicitly
    assert load_checkpoint(root, fresh, step=3)[0] == 3


def test_load_errors_are_clear(tiny_model_dir, tmp_path):
    tr = Trainer(make_cfg(tiny_model_dir))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_checkpoint(tmp_path / "missing", tr)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "empty", tr)
    (tmp_path / "empty" / "latest").write_text("oops")
    with pytest.raises(ValueError, match="expected a step number"):
        load_checkpoint(tmp_path / "empty", tr)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


def test_save_hf_and_export_reload_identical_logits(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slick.ckpt.export import main as export_main

    tr = Trainer(make_cfg(tiny_model_dir, lr=1e-2))
    _step(tr, make_samples(3))
    ids = [1, 50, 60, 70, 80, 90]
    want = _logits(tr.model, ids)
    out = save_hf(tmp_path / "hf", tr)
    save_hf(tmp_path / "hf", tr)                          # overwriting an existing export works
    m = AutoModelForCausalLM.from_pretrained(out)
    assert torch.equal(_logits(m, ids), want)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert (out / "generation_config.json").is_file()

    save_checkpoint(tmp_path / "ck", 5, tr, {})
    assert export_main([str(tmp_path / "ck"), str(tmp_path / "exp")]) == 0
    assert torch.equal(_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "exp"), ids), want)
    assert export_main([str(tmp_path / "ck"), str(tmp_path / "exp2"), "--step", "9"]) == 2
    assert not (tmp_path / "exp2").exists()


async def _generate_and_sync(tr, engine, mode, disk_dir, prompt):
    from slick.types import SamplingParams

    sp = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
    before = await engine.generate(prompt, sp)
    secs = await sync_weights(tr, [engine], mode=mode, disk_dir=disk_dir)
    after = await engine.generate(prompt, sp)
    version = await engine.get_weight_version()
    await engine.close()
    return before, after, secs, version


@pytest.mark.parametrize("mode", ["tensors", "disk"])
def test_sync_weights_to_local_engine(tiny_model_dir, tmp_path, mode):
    """After a sync, the engine's logprobs of its own samples equal the trainer's (fp32)."""
    from slick.engine.local import LocalEngine
    from slick.types import Sample

    tr = Trainer(make_cfg(tiny_model_dir, lr=5e-2))
    for _ in range(2):
        _step(tr, make_samples(3))
    engine = LocalEngine(tiny_model_dir, dtype="fp32", device="cpu", max_running=2, seed=0)
    prompt = [1, 20, 30, 40]
    before, after, secs, version = asyncio.run(
        _generate_and_sync(tr, engine, mode, tmp_path / "sync", prompt))
    assert secs > 0 and version == tr.version == 2

    def trainer_lps(gen):
        s = Sample(prompt_ids=prompt, response_ids=gen.token_ids)
        return tr.compute_logprobs([s])[0]

    assert torch.allclose(trainer_lps(after), torch.tensor(after.logprobs), atol=1e-4)
    assert not torch.allclose(trainer_lps(before), torch.tensor(before.logprobs), atol=1e-3)
    with pytest.raises(ValueError, match="disk_dir"):
        asyncio.run(sync_weights(tr, [], mode="disk"))

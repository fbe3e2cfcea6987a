"""Sharded (torch.distributed.checkpoint) trainer checkpoints: 1 -> 2 ranks, 2 -> 1 rank, HF export.

One spawn of 2 real gloo ranks does both directions: it resumes a one-process checkpoint, trains a step,
saves a sharded checkpoint and trains once more; this process then checks the ranks against a one-process
trainer, resumes the sharded checkpoint with one process, and exports it to a HF directory.
"""
import json

import pytest
import torch

from tests.test_train import simple_loss
from tests.test_train_fsdp import batch, make_cfg, run_ranks
from tests.batches import batch_of


def cfg_for(model_dir):
    # weight decay: two optimizer groups (matrices, vectors), numbered group after group in the saved state
    return make_cfg(model_dir, lr=1e-2, lr_warmup_steps=3, micro_batch_size=2, clip_grad=1.0, weight_decay=0.1)


def step(tr):
    samples = batch()
    return tr.train_step(batch_of(samples, [torch.ones(len(s.response_ids)) for s in samples]), simple_loss)


def full_state(tr):
    """Full fp32 weights and AdamW state by parameter name (collective when sharded)."""
    from slick.train.fsdp import full_tensor

    opt = {}
    for n, m in zip(tr.param_names, tr.master):
        opt[n] = {k: full_tensor(v).clone() for k, v in tr.optimizer.state[m].items()}
    return {"weights": {k: v.clone() for k, v in tr.full_precision_state_dict().items()}, "optim": opt,
            "version": tr.version, "lr": tr.optimizer.param_groups[0]["lr"]}


def _rank_main(rank, world, model_dir, legacy_root, sharded_root):
    from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint
    from slick.train.trainer import Trainer

    tr = Trainer(cfg_for(model_dir))
    got_step, got_state = load_checkpoint(legacy_root, tr)          # 1 rank -> 2 ranks
    loaded = full_state(tr)
    step(tr)
    after_legacy = full_state(tr)
    save_checkpoint(sharded_root, 2, tr, {"cursor": 5, "rank_that_wrote": rank})   # 2 ranks -> disk
    saved = full_state(tr)
    m = step(tr)
    return {"loaded": loaded, "step": got_step, "state": got_state, "after_legacy": after_legacy,
            "saved": saved, "next": full_state(tr), "loss": m["loss"]}


def assert_states(got, want, exact):
    assert got["version"] == want["version"] and got["lr"] == want["lr"]
    assert sorted(got["weights"]) == sorted(want["weights"])
    for n, w in want["weights"].items():
        if exact:
            assert torch.equal(got["weights"][n], w), n
        else:
            assert float((got["weights"][n] - w).abs().max()) <= 1e-5, n
    for n, st in want["optim"].items():
        assert sorted(got["optim"][n]) == sorted(st) == ["exp_avg", "exp_avg_sq", "step"]
        for k, v in st.items():
            if exact:
                assert torch.equal(got["optim"][n][k], v), (n, k)
            else:
                assert torch.allclose(got["optim"][n][k], v, atol=1e-6, rtol=1e-4), (n, k)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


@pytest.mark.slow
def test_sharded_checkpoint_resumes_across_rank_counts_and_exports(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint
    from slick.ckpt.dcp import is_sharded
    from slick.ckpt.export import main as export_main
    from slick.train.trainer import Trainer

    # one process: a step, a checkpoint in today's format, then the step the 2 ranks must reproduce
    one = Trainer(cfg_for(tiny_model_dir))
    step(one)
    save_checkpoint(tmp_path / "legacy", 1, one, {"cursor": 3})
    at_save = full_state(one)
    step(one)
    want_after_legacy = full_state(one)

    ranks = run_ranks(_rank_main, 2, (str(tiny_model_dir), str(tmp_path / "legacy"), str(tmp_path / "sharded")),
                      tmp_path)
    for r in ranks:                                   # 1 -> 2: same weights, optimizer state, version
        assert (r["step"], r["state"]) == (1, {"cursor": 3})
        assert_states(r["loaded"], at_save, exact=True)
        assert_states(r["after_legacy"], want_after_legacy, exact=False)
    assert ranks[0]["saved"]["version"] == 2

    # the sharded layout, complete and atomic
    root = tmp_path / "sharded"
    d = root / "step_000002"
    assert (root / "latest").read_text().strip() == "2" and is_sharded(d)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002"]      # no temp dirs left
    meta = json.loads((d / "trainer_state.json").read_text())
    assert (meta["format"], meta["world_size"], meta["version"], meta["optim_state"]) == ("dcp", 2, 2, True)
    assert sorted(p.name for p in (d / "rng").iterdir()) == ["rank_00000.pt", "rank_00001.pt"]
    assert (d / "hf" / "config.json").is_file() and not list((d / "hf").glob("*.safetensors"))
    assert json.loads((d / "state.json").read_text()) == {"cursor": 5, "rank_that_wrote": 0}

    # 2 -> 1: exact weights and optimizer state, then the same next step as the 2 ranks
    two = Trainer(cfg_for(tiny_model_dir))
    assert load_checkpoint(root, two) == (2, {"cursor": 5, "rank_that_wrote": 0})
    assert_states(full_state(two), ranks[0]["saved"], exact=True)
    ids = [1, 50, 60, 70, 80, 90]
    want_logits = _logits(two.model, ids)
    m = step(two)
    assert m["loss"] == pytest.approx(ranks[0]["loss"], rel=1e-5)
    assert_states(full_state(two), ranks[0]["next"], exact=False)

    # slick export: a HF directory from the sharded checkpoint alone, identical logits
    assert export_main([str(root), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert torch.equal(_logits(exported, ids), want_logits)
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert (tmp_path / "hf" / "generation_config.json").is_file()


def test_export_of_an_incomplete_sharded_checkpoint_is_refused(tmp_path):
    from slick.ckpt.export import main as export_main

    d = tmp_path / "ck" / "step_000001"
    (d / "dcp").mkdir(parents=True)
    (d / "dcp" / ".metadata").write_bytes(b"")      # no trainer_state.json: the writer never finished
    assert export_main([str(tmp_path / "ck"), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()

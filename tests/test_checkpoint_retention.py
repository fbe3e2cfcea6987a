"""Checkpoints a reader can trust: a truncated, partial or corrupt newest checkpoint is skipped with a warning
naming it and why (one process and sharded DCP ranks), stale temp directories of interrupted writes are removed
at start-up, and --keep-checkpoints / --save-retain-interval retention."""
import asyncio
import json
import logging
import os

import pytest
import torch

from slick.config import ConfigError
from slick.loop.sync import train
from slick.ckpt import checkpoint as ckpt
from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint
from slick.train.trainer import Trainer
from tests import test_loop
from tests.test_loop import make_cfg
from tests.test_train import make_cfg as trainer_cfg, make_samples, simple_loss
from tests.batches import batch_of

prompts = test_loop.prompts   # the fixture


def _step(tr, samples):
    return tr.train_step(batch_of(samples, [torch.ones(len(s.response_ids)) for s in samples]), simple_loss)


def _weights(tr):
    return {n: w.clone() for n, w in tr.named_weights()}


@pytest.fixture(scope="module")
def three_checkpoints(tiny_model_dir, tmp_path_factory):
    """Checkpoints of steps 1, 2, 3 (one trainer step each) and the weights at each."""
    root = tmp_path_factory.mktemp("three") / "ck"
    tr = Trainer(trainer_cfg(tiny_model_dir, lr=1e-2))
    samples, weights = make_samples(4), {}
    for s in (1, 2, 3):
        _step(tr, samples)
        save_checkpoint(root, s, tr, {"cursor": s})
        weights[s] = _weights(tr)
    return root, weights


def _copy(root, tmp_path):
    import shutil

    dst = tmp_path / "ck"
    shutil.copytree(root, dst)
    return dst


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return len(data)


CORRUPTIONS = {
    "truncated weights": (lambda d: _truncate(d / "model" / "model.safetensors"),
                          "model/model.safetensors has {half} bytes, manifest.json says {full}"),
    "missing optimizer": (lambda d: (d / "optimizer.pt").unlink(), "optimizer.pt missing"),
    "bad state json": (lambda d: (d / "state.json").write_text('{"cursor": 3'), "state.json is not valid JSON"),
    "no trainer marker": (lambda d: (d / "trainer_state.json").unlink(), "trainer_state.json missing"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning(tiny_model_dir, three_checkpoints, tmp_path, caplog,
                                                               kind):
    src, weights = three_checkpoints
    root = _copy(src, tmp_path)
    corrupt, why = CORRUPTIONS[kind]
    full = corrupt(root / "step_000003")
    why = why.format(full=full, half=(full or 0) // 2)
    tr = Trainer(trainer_cfg(tiny_model_dir, lr=1e-2, seed=11))
    with caplog.at_level(logging.WARNING, logger="slick.checkpoint"):
        step, state = load_checkpoint(root, tr)
    assert (step, state, tr.version) == (2, {"cursor": 2}, 2)
    assert all(torch.equal(w, weights[2][n]) for n, w in tr.named_weights())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(root / "step_000003") in m and why in m for m in warnings), warnings
    # an explicitly asked-for step is refused with the reason, never replaced by another one
    with pytest.raises(FileNotFoundError, match=f"step 3 cannot be loaded: {why}"):
        ckpt.resolve_step_dir(root, 3)


def test_every_checkpoint_corrupt_is_an_error_naming_each(three_checkpoints, tmp_path):
    root = _copy(three_checkpoints[0], tmp_path)
    for s in (1, 2, 3):
        (root / ckpt.step_dir_name(s) / "rng.pt").unlink()
    with pytest.raises(FileNotFoundError) as e:
        ckpt.resolve_step_dir(root)
    msg = str(e.value)
    assert "no checkpoint that can be loaded" in msg
    assert all(f"step_00000{s} (rng.pt missing" in msg for s in (1, 2, 3)), msg


def test_latest_marker_is_the_commit_point(three_checkpoints, tmp_path):
    root = _copy(three_checkpoints[0], tmp_path)
    assert (root / "latest").read_text() == "3\n"
    assert json.loads((root / "step_000003" / "manifest.json").read_text())["files"]["optimizer.pt"] > 0
    (root / "latest").write_text("2\n")        # killed between the rename and the marker: step 3 not committed
    assert ckpt.resolve_step_dir(root) == (2, root / "step_000002")
    (root / "latest").write_text("garbage")    # no readable marker: the newest complete directory
    assert ckpt.resolve_step_dir(root)[0] == 3
    (root / "latest").unlink()
    assert ckpt.resolve_step_dir(root)[0] == 3


def test_stale_temp_entries_are_removed_with_their_size(tmp_path, caplog):
    root = tmp_path / "ck"
    (root / ".tmp-step_000005-4242" / "model").mkdir(parents=True)
    (root / ".tmp-step_000005-4242" / "model" / "w.bin").write_bytes(b"x" * 1000)
    (root / ".tmp-step_000006-ranks").mkdir()
    (root / ".tmp-step_000006-ranks" / "a").write_bytes(b"y" * 24)
    (root / ".old-step_000004-77").mkdir()
    (root / ".latest.tmp-99").write_text("4\n")
    (root / "step_000004").mkdir()                               # a real checkpoint: untouched
    (root / "step_000004" / "f").write_text("keep")
    with caplog.at_level(logging.WARNING, logger="slick.checkpoint"):
        assert ckpt.clean_stale_temp(root) == (4, 1026)
    assert sorted(p.name for p in root.iterdir()) == ["step_000004"]
    assert any("removed 4 stale temp entries, 1026 bytes" in r.getMessage() for r in caplog.records)
    assert any(".tmp-step_000005-4242" in r.getMessage() and "1000 bytes" in r.getMessage() for r in caplog.records)
    assert ckpt.clean_stale_temp(root) == (0, 0) and ckpt.clean_stale_temp(tmp_path / "absent") == (0, 0)


def test_retained_steps():
    steps = list(range(1, 11))
    assert ckpt.retained_steps(steps, None, None) == set(steps)
    assert ckpt.retained_steps(steps, 3, None) == {8, 9, 10}
    assert ckpt.retained_steps(steps, 2, 4) == {4, 8, 9, 10}
    assert ckpt.retained_steps(steps, 20, 3) == set(steps)
    assert ckpt.retained_steps(steps, None, 4) == {4, 8, 10}     # Megatron's --save-retain-interval alone
    assert ckpt.retained_steps([], 2, 2) == set()


def test_retention_and_temp_cleanup_in_a_run(tiny_model_dir, prompts, tmp_path):
    save = tmp_path / "ck"
    (save / ".tmp-step_000009-1").mkdir(parents=True)
    (save / ".tmp-step_000009-1" / "optimizer.pt").write_bytes(b"z" * 10)
    cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run", num_rollout=5, save=str(save), save_interval=1,
                   keep_checkpoints=2, save_retain_interval=2)
    asyncio.run(train(cfg))
    assert sorted(p.name for p in save.iterdir()) == ["latest", "step_000002", "step_000004", "step_000005"]
    assert ckpt.resolve_step_dir(save)[0] == 5
    # without the flags every checkpoint stays (today's behaviour)
    cfg = make_cfg(tiny_model_dir, prompts, tmp_path / "run2", num_rollout=3, save=str(tmp_path / "all"),
                   save_interval=1)
    asyncio.run(train(cfg))
    assert ckpt.list_steps(tmp_path / "all") == [1, 2, 3]


def test_retention_flags_are_checked(tiny_model_dir, prompts, tmp_path):
    def problems(**over):
        with pytest.raises(ConfigError) as e:
            make_cfg(tiny_model_dir, prompts, tmp_path / "run", **over)
        return str(e.value)

    assert "--keep-checkpoints must be >= 1 (got 0)" in problems(save="x", keep_checkpoints=0)
    assert "--save-retain-interval must be >= 1 (got -1)" in problems(save="x", save_retain_interval=-1)
    assert "--save-retain-interval applies to the checkpoints in --save" in problems(save_retain_interval=5)
    assert "--keep-checkpoints applies to the checkpoints in --save" in problems(keep_checkpoints=2)


def _rank_main(rank, world, model_dir, root):
    """2 gloo ranks: sharded checkpoints 1..3 kept 2 at a time, then the newest shard file truncated; every
    rank resumes from step 2."""
    from tests.test_checkpoint_dcp import cfg_for, step

    tr = Trainer(cfg_for(model_dir))
    for s in (1, 2, 3):
        step(tr)
        save_checkpoint(root, s, tr, {"cursor": s}, keep_last=2)
    kept = ckpt.list_steps(root)
    from slick.proc import dist as D

    D.barrier("test: checkpoints written")
    if rank == 0:
        shard = sorted((ckpt.Path(root) / "step_000003" / "dcp").glob("*.distcp"))[-1]
        _truncate(shard)
    D.barrier("test: shard truncated")
    fresh = Trainer(cfg_for(model_dir))
    got = load_checkpoint(root, fresh)
    return {"kept": kept, "got": got, "version": fresh.version}


@pytest.mark.slow
def test_sharded_truncated_newest_checkpoint_is_skipped_on_every_rank(tiny_model_dir, tmp_path):
    from tests.test_train_fsdp import run_ranks

    root = tmp_path / "sharded"
    ranks = run_ranks(_rank_main, 2, (str(tiny_model_dir), str(root)), tmp_path)
    for r in ranks:
        assert r["kept"] == [2, 3]
        assert r["got"] == (2, {"cursor": 2}) and r["version"] == 2
    assert not [p for p in os.listdir(root) if p.startswith(".")]


def test_a_failed_checkpoint_write_names_the_step_dir_and_free_space(tiny_model_dir, tmp_path):
    """A write that fails part-way (here: the disk fills after the trainer's first file; the bench does it with a
    real full tmpfs) leaves the previous checkpoint as `latest`, no temp directory, and says where and why."""
    import errno

    root = tmp_path / "ck"
    tr = Trainer(trainer_cfg(tiny_model_dir, lr=1e-2))
    save_checkpoint(root, 1, tr, {"cursor": 1})
    real_save = tr.save

    def save_then_fill_disk(d):
        real_save(d)
        raise OSError(errno.ENOSPC, "No space left on device")

    tr.save = save_then_fill_disk
    with pytest.raises(ckpt.CheckpointWriteError) as e:
        save_checkpoint(root, 2, tr, {"cursor": 2})
    msg = str(e.value)
    assert f"step 2 into {root / 'step_000002'}" in msg and "No space left on device" in msg
    assert "MiB free" in msg and "previous checkpoint" in msg
    assert (root / "latest").read_text().strip() == "1"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001"]
    step, state = load_checkpoint(root, Trainer(trainer_cfg(tiny_model_dir, lr=1e-2)))
    assert (step, state["cursor"]) == (1, 1)

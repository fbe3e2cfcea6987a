"""Run checkpoints and HF exports, written atomically.

Layout of ``save_root``::

    save_root/
      latest                  text file: the step number of the newest complete checkpoint
      step_000010/            one checkpoint (complete or absent, never half-written)
        model/                a full HF directory (fp32 weights, config, generation config, tokenizer)
        optimizer.pt scheduler.pt rng.pt trainer_state.json
        state.json | state.pt the loop's state dict (JSON when it serialises, else torch.save)

A checkpoint is written into ``save_root/.tmp-step_XXXXXX-<pid>`` and renamed into place with
``os.replace``; ``latest`` is then rewritten via a temp file + rename. A crash at any point leaves the
previous checkpoint (and ``latest`` pointing at it) intact.

With several trainer ranks (``slick.train.dist``) every rank calls these functions: the trainer's writes are
collective (a sharded ``slick.train.dcp`` directory instead of ``model/`` + ``optimizer.pt``), rank 0 alone
creates and renames the temp directory and writes ``state``, ``step.json`` and ``latest``, with barriers in
between; all ranks return once the checkpoint is in place. The filesystem must be shared by the ranks.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

from slick.train import dist as D

STEP_PREFIX = "step_"


def step_dir_name(step: int) -> str:
    """``step_000042`` for step 42."""
    return f"{STEP_PREFIX}{int(step):06d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file in the same directory and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def replace_dir_atomic(tmp_dir: Path, final_dir: Path) -> None:
    """Move the finished ``tmp_dir`` to ``final_dir``; an existing ``final_dir`` is swapped out first."""
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".old-{final_dir.name}-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    _fsync_dir(final_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_dir_atomic(final_dir, writer) -> Path:
    """Call ``writer(tmp_dir)`` on a fresh sibling temp dir, then rename it to ``final_dir``.

    If ``writer`` raises, the temp dir is removed and ``final_dir`` is untouched. With several ranks: call it
    on every rank with a collective ``writer``; rank 0 owns the directories.
    """
    if D.is_distributed():
        return _write_dir_atomic_ranks(Path(final_dir), writer)
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.with_name(f".tmp-{final_dir.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        writer(tmp)
        replace_dir_atomic(tmp, final_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final_dir


def _write_dir_atomic_ranks(final_dir: Path, writer) -> Path:
    rank, n = D.world()
    tmp = final_dir.with_name(f".tmp-{final_dir.name}-ranks")
    if rank == 0:
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    D.barrier(f"{final_dir}: temp directory created")
    error: Optional[BaseException] = None
    try:
        writer(tmp)
    except Exception as e:  # every rank must learn that one failed, or the others would wait forever
        error = e
    failed = D.all_reduce_values([1.0 if error else 0.0], "sum", f"{final_dir}: write status")[0]
    if failed:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        D.barrier(f"{final_dir}: cleanup after a failed write")
        if error is not None:
            raise error
        raise D.RankError(f"trainer rank {rank} of {n}: writing {final_dir} failed on {int(failed)} other "
                          "rank(s); the previous checkpoint is intact")
    if rank == 0:
        replace_dir_atomic(tmp, final_dir)
    D.barrier(f"{final_dir}: renamed into place")
    return final_dir


def _write_state(d: Path, state: dict) -> None:
    try:
        text = json.dumps(state)
    except (TypeError, ValueError):
        torch.save(state, d / "state.pt")
        return
    (d / "state.json").write_text(text)


def _read_state(d: Path) -> dict:
    if (d / "state.json").is_file():
        return json.loads((d / "state.json").read_text())
    if (d / "state.pt").is_file():
        return torch.load(d / "state.pt", weights_only=False)
    return {}


def save_checkpoint(save_root, step: int, trainer, state: Optional[dict] = None) -> Path:
    """Write ``save_root/step_{step:06d}`` (trainer + loop ``state``) atomically, then point ``latest`` at it."""
    root = Path(save_root)
    root.mkdir(parents=True, exist_ok=True)

    def writer(tmp: Path) -> None:
        trainer.save(tmp)
        if D.world()[0] == 0:
            _write_state(tmp, dict(state or {}))
            (tmp / "step.json").write_text(json.dumps({"step": int(step)}))

    final = write_dir_atomic(root / step_dir_name(step), writer)
    if D.world()[0] == 0:
        write_text_atomic(root / "latest", f"{int(step)}\n")
    D.barrier(f"{root}: latest -> {step}")
    return final


def list_steps(root) -> list[int]:
    """Steps of the complete checkpoints under ``root`` (ascending)."""
    steps = []
    for p in Path(root).glob(f"{STEP_PREFIX}*"):
        tail = p.name[len(STEP_PREFIX):]
        if p.is_dir() and tail.isdigit() and (p / "trainer_state.json").is_file():
            steps.append(int(tail))
    return sorted(steps)


def resolve_step_dir(load_root, step: Optional[int] = None) -> tuple[int, Path]:
    """(step, directory) for ``step``, or ``latest`` (falling back to the newest complete step dir).

    ``load_root`` may also be a step directory itself.
    """
    root = Path(load_root)
    if not root.is_dir():
        raise FileNotFoundError(f"--load: checkpoint directory not found: {root}")
    if (root / "trainer_state.json").is_file() and step is None:
        meta = root / "step.json"
        s = json.loads(meta.read_text())["step"] if meta.is_file() else int(root.name[len(STEP_PREFIX):] or 0)
        return int(s), root
    if step is None:
        latest = root / "latest"
        if latest.is_file():
            text = latest.read_text().strip()
            if not text.isdigit():
                raise ValueError(f"{latest}: expected a step number, got {text!r}")
            step = int(text)
            if not (root / step_dir_name(step) / "trainer_state.json").is_file():
                step = None
        if step is None:
            steps = list_steps(root)
            if not steps:
                raise FileNotFoundError(f"{root}: no checkpoint (no 'latest' file and no complete step_* dir)")
            step = steps[-1]
    d = root / step_dir_name(step)
    if not (d / "trainer_state.json").is_file():
        raise FileNotFoundError(f"{d}: checkpoint for step {step} not found or incomplete")
    return int(step), d


def load_checkpoint(load_root, trainer, step: Optional[int] = None) -> tuple[int, dict]:
    """Restore ``trainer`` from the latest (or given) checkpoint; returns ``(step, loop_state)``."""
    s, d = resolve_step_dir(load_root, step)
    trainer.load(d)
    return s, _read_state(d)


def save_hf(out_dir, trainer) -> Path:
    """Write an HF model directory (safetensors, config, generation config, tokenizer) atomically."""
    return write_dir_atomic(out_dir, trainer.save_hf_files)


def export_checkpoint(load_root, out_dir, step: Optional[int] = None) -> Path:
    """HF model directory of a run checkpoint in ``out_dir``, atomically: a copy of a one-process checkpoint's
    ``model/`` (no model is loaded), or the fp32 weights gathered from a sharded one (``slick.train.dcp``)."""
    from slick.train.dcp import export_sharded, is_sharded

    s, d = resolve_step_dir(load_root, step)
    if is_sharded(d):
        return write_dir_atomic(out_dir, lambda tmp: export_sharded(d, tmp))
    src = d / "model"
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: checkpoint has no HF model (config.json missing)")

    def writer(tmp: Path) -> None:
        for f in src.iterdir():
            if f.is_file():
                shutil.copy2(f, tmp / f.name)

    return write_dir_atomic(out_dir, writer)

"""Run checkpoints, written atomically (HF exports of them: ``slick.ckpt.export``).

Layout of ``save_root``::

    save_root/
      latest                  text file: the step number of the newest complete checkpoint
      step_000010/            one checkpoint (complete or absent, never half-written)
        model/                a full HF directory (fp32 weights, config, generation config, tokenizer)
        optimizer.pt scheduler.pt rng.pt trainer_state.json
        state.json | state.pt the loop's state dict (JSON when it serialises, else torch.save)
        manifest.json         written last inside the temp dir: every other file's size in bytes

A checkpoint is written into ``save_root/.tmp-step_XXXXXX-<pid>`` and renamed into place with
``os.replace``; ``latest`` is then rewritten via a temp file + rename. A crash at any point leaves the
previous checkpoint (and ``latest`` pointing at it) intact. Loading checks the newest checkpoint first
(:func:`checkpoint_problem`: manifest sizes, state files that parse) and falls back to the previous complete
one with a warning naming what is wrong. :func:`clean_stale_temp` removes the ``.tmp-*`` left by writes that
were interrupted; :func:`prune_checkpoints` applies retention (``--keep-checkpoints``,
``--save-retain-interval``) by renaming a doomed checkpoint to ``.tmp-delete-*`` before removing it.

With several trainer ranks (``slick.proc.dist``) every rank calls these functions: the trainer's writes are
collective (a sharded ``slick.ckpt.dcp`` directory instead of ``model/`` + ``optimizer.pt``), rank 0 alone
creates and renames the temp directory and writes ``state``, ``step.json`` and ``latest``, with barriers in
between; all ranks return once the checkpoint is in place. The filesystem must be shared by the ranks.

No write removes what slick did not create (``slick.ckpt.output_dirs``): :func:`write_dir_atomic` replaces an
existing directory only when it is empty or slick's output of the same kind (an HF export carries
``.slick-output.json``); retention and the stale-temp cleanup touch only ``step_*`` checkpoints and slick's
own temp entries. Every ``.pt`` file loads with ``weights_only=True`` (``slick.ckpt.safe_load``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

from slick.proc import dist as D
from slick.ckpt.atomic_files import fsync_dir, write_text_atomic
from slick.ckpt.output_dirs import (CHECKPOINT_ROOT, CHECKPOINT_STEP, HF_EXPORT, TEMP_ENTRY, OutputDirError,
                                     describe, is_checkpoint_step, owned, write_marker)
from slick.ckpt.safe_load import load_pt, unsafe_globals
from slick.types import ClusterFailure

STEP_PREFIX = "step_"
MANIFEST = "manifest.json"

log = logging.getLogger("slick.checkpoint")


def step_dir_name(step: int) -> str:
    """``step_000042`` for step 42."""
    return f"{STEP_PREFIX}{int(step):06d}"


MARKED_KINDS = (HF_EXPORT,)   # output kinds recognised by slick's marker file alone (no file of their own)


def _check_replaceable(final_dir: Path, kind: str) -> None:
    """Refuse (OutputDirError) to replace ``final_dir`` unless it is absent, empty or slick's ``kind``."""
    if final_dir.is_symlink() or (final_dir.exists() and not final_dir.is_dir()):
        what = "a symbolic link" if final_dir.is_symlink() else "not a directory"
        raise OutputDirError(f"{final_dir}: is {what}; slick replaces only a directory of its own (nothing was "
                             f"written)")
    if final_dir.is_dir() and not owned(final_dir, kind):
        raise OutputDirError(f"{final_dir}: refusing to replace it with {kind}: it is {describe(final_dir)}; "
                             f"writing would delete what it holds (nothing was written)")


def replace_dir_atomic(tmp_dir: Path, final_dir: Path, kind: str) -> None:
    """Move the finished ``tmp_dir`` to ``final_dir``; an existing ``final_dir`` is swapped out first, and only
    when it is empty or slick's output of ``kind`` (``slick.ckpt.output_dirs.owned``)."""
    _check_replaceable(final_dir, kind)
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".old-{final_dir.name}-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    fsync_dir(final_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_dir_atomic(final_dir, writer, *, kind: str) -> Path:
    """Call ``writer(tmp_dir)`` on a fresh sibling temp dir, then rename it to ``final_dir``.

    ``kind`` (``slick.ckpt.output_dirs``): an existing ``final_dir`` is replaced only when it is empty or
    slick's output of that kind, else OutputDirError before ``writer`` runs; an ``hf-export`` gets its marker.
    If ``writer`` raises, the temp dir is removed and ``final_dir`` is untouched. With several ranks: call it
    on every rank with a collective ``writer``; rank 0 owns the directories.
    """
    _check_replaceable(Path(final_dir), kind)
    if D.is_distributed():
        return _write_dir_atomic_ranks(Path(final_dir), writer, kind)
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = final_dir.with_name(f".tmp-{final_dir.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        writer(tmp)
        if kind in MARKED_KINDS:
            write_marker(tmp, kind)
        replace_dir_atomic(tmp, final_dir, kind)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final_dir


def _write_dir_atomic_ranks(final_dir: Path, writer, kind: str) -> Path:
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
        if kind in MARKED_KINDS:
            write_marker(tmp, kind)
        replace_dir_atomic(tmp, final_dir, kind)
    D.barrier(f"{final_dir}: renamed into place")
    return final_dir


def _plain(obj):
    """``obj`` with numpy scalars and arrays (in dicts, lists, tuples) as Python numbers and lists."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_plain(v) for v in obj)
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def _write_state(d: Path, state: dict) -> None:
    state = _plain(state)
    try:
        text = json.dumps(state)
    except (TypeError, ValueError):
        torch.save(state, d / "state.pt")
        unsafe = unsafe_globals(d / "state.pt")
        if unsafe:   # it would not load (weights_only=True): say so now, not at the resume
            raise ValueError(f"the loop state of this checkpoint holds {', '.join(unsafe)}: a checkpoint stores "
                             f"tensors and plain data only (it loads with torch.load(weights_only=True))")
        return
    (d / "state.json").write_text(text)


def _read_state(d: Path) -> dict:
    if (d / "state.json").is_file():
        return json.loads((d / "state.json").read_text())
    if (d / "state.pt").is_file():
        return load_pt(d / "state.pt")
    return {}


class CheckpointWriteError(OSError, RuntimeError):
    """A checkpoint could not be written (full disk, permissions): names the step directory and the free space.
    An OSError (what the write raised, in most cases) and a RuntimeError (what torch raises on a full disk)."""


def save_checkpoint(save_root, step: int, trainer, state: Optional[dict] = None, *,
                    keep_last: Optional[int] = None, keep_every: Optional[int] = None) -> Path:
    """Write ``save_root/step_{step:06d}`` (trainer + loop ``state``) atomically, point ``latest`` at it, then
    prune older checkpoints by ``keep_last`` / ``keep_every`` (:func:`prune_checkpoints`; None keeps all)."""
    root = Path(save_root)
    if root.is_dir() and not owned(root, CHECKPOINT_ROOT):
        raise OutputDirError(f"--save {root}: it is {describe(root)}; slick writes checkpoints only into a new or "
                             f"empty directory or one holding checkpoints ('latest', step_*); nothing was written")
    root.mkdir(parents=True, exist_ok=True)

    def writer(tmp: Path) -> None:
        trainer.save(tmp)   # collective; every rank's files are in place when it returns
        if D.world()[0] == 0:
            _write_state(tmp, dict(state or {}))
            (tmp / "step.json").write_text(json.dumps({"step": int(step)}))
            write_manifest(tmp)

    try:
        final = write_dir_atomic(root / step_dir_name(step), writer, kind=CHECKPOINT_STEP)
    except (OSError, RuntimeError) as e:   # a full disk surfaces as torch's RuntimeError, not always ENOSPC
        if isinstance(e, (D.RankError, ClusterFailure)):   # a rank or actor failed: its own error names it
            raise
        free = shutil.disk_usage(root).free
        raise CheckpointWriteError(
            f"writing the checkpoint of step {step} into {root / step_dir_name(step)} failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); {free / 2**20:.0f} MiB free on "
            f"that file system. Nothing was half-written: the previous checkpoint ({root / 'latest'}) is intact "
            f"and --load resumes from it") from e
    if D.world()[0] == 0:
        write_text_atomic(root / "latest", f"{int(step)}\n")
        if keep_last or keep_every:
            prune_checkpoints(root, keep_last, keep_every)
    D.barrier(f"{root}: latest -> {step}")
    return final


def write_manifest(d) -> None:
    """Record the size of every file under ``d`` in ``d/manifest.json`` (the last file a checkpoint gets)."""
    d = Path(d)
    files = {str(p.relative_to(d)): p.stat().st_size for p in sorted(d.rglob("*"))
             if p.is_file() and p.name != MANIFEST}
    (d / MANIFEST).write_text(json.dumps({"files": files}))


def checkpoint_problem(d) -> Optional[str]:
    """Why the checkpoint directory ``d`` cannot be loaded (None when it looks complete): the trainer's
    marker, the manifest (a missing or truncated file), and the JSON state files must all check out.
    Checkpoints written before manifests existed are checked by their marker and state files alone."""
    d = Path(d)
    if not d.is_dir():
        return "not a directory"
    if not (d / "trainer_state.json").is_file():
        return "trainer_state.json missing (the trainer's write did not finish)"
    for name in ("trainer_state.json", "step.json", "state.json", MANIFEST):
        f = d / name
        if f.is_file():
            try:
                json.loads(f.read_text())
            except (ValueError, OSError) as e:
                return f"{name} is not valid JSON ({e})"
    problem = _field_problem(d)
    if problem:
        return problem
    if (d / MANIFEST).is_file():
        files = json.loads((d / MANIFEST).read_text())["files"]
        for rel, size in files.items():
            f = d / rel
            if not f.is_file():
                return f"{rel} missing (listed in {MANIFEST})"
            actual = f.stat().st_size
            if actual != size:
                return f"{rel} has {actual} bytes, {MANIFEST} says {size} (truncated or overwritten)"
    return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _field_problem(d: Path) -> Optional[str]:
    """The fields slick reads from the JSON files of a checkpoint, with the types it writes them: the manifest's
    ``files`` (relative path inside ``d`` -> size in bytes), ``trainer_state.json``'s ``version`` and
    ``step.json``'s ``step``. A wrong type or a path outside the checkpoint is named with file and field."""
    state = json.loads((d / "trainer_state.json").read_text())
    if not isinstance(state, dict) or not _is_int(state.get("version")):
        got = state.get("version") if isinstance(state, dict) else state
        return f"trainer_state.json: field 'version' is {str(got)[:80]!r}, not an integer"
    if (d / "step.json").is_file():
        step = json.loads((d / "step.json").read_text())
        if not isinstance(step, dict) or not _is_int(step.get("step")) or step["step"] < 0:
            return f"step.json: field 'step' is {str(step.get('step') if isinstance(step, dict) else step)[:80]!r}, " \
                   f"not a step number"
    if not (d / MANIFEST).is_file():
        return None
    manifest = json.loads((d / MANIFEST).read_text())
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        return f"{MANIFEST}: field 'files' is {str(files)[:80]}, not an object of file -> size in bytes"
    for rel, size in files.items():
        if not _is_int(size) or size < 0:
            return f"{MANIFEST}: field 'files' gives {rel!r} the size {str(size)[:80]}, not a number of bytes"
        if Path(rel).is_absolute() or ".." in Path(rel).parts or not rel:
            return f"{MANIFEST}: field 'files' names {rel!r}, a path outside the checkpoint"
    return None


def _step_dirs(root: Path) -> dict[int, Path]:
    out = {}
    for p in root.glob(f"{STEP_PREFIX}*"):
        tail = p.name[len(STEP_PREFIX):]
        if p.is_dir() and tail.isdigit():
            out[int(tail)] = p
    return out


def list_steps(root) -> list[int]:
    """Steps of the checkpoints under ``root`` that have a trainer marker (ascending; see
    :func:`complete_steps` for the full check)."""
    return sorted(s for s, p in _step_dirs(Path(root)).items() if (p / "trainer_state.json").is_file())


def complete_steps(root) -> list[int]:
    """Steps of the checkpoints under ``root`` that pass :func:`checkpoint_problem` (ascending)."""
    return sorted(s for s, p in _step_dirs(Path(root)).items() if checkpoint_problem(p) is None)


def _latest_step(root: Path) -> Optional[int]:
    latest = root / "latest"
    if not latest.is_file():
        return None
    text = latest.read_text().strip()
    if not text.isdigit():
        log.warning("%s: expected a step number, got %r; using the newest complete checkpoint instead",
                    latest, text)
        return None
    return int(text)


def _step_of_dir(d: Path) -> int:
    meta = d / "step.json"
    if meta.is_file():
        return int(json.loads(meta.read_text())["step"])
    tail = d.name[len(STEP_PREFIX):]
    return int(tail) if tail.isdigit() else 0


def resolve_step_dir(load_root, step: Optional[int] = None) -> tuple[int, Path]:
    """(step, directory) of the checkpoint to load: ``step`` when given (an error names what is wrong with it),
    else the one ``latest`` names, falling back to older complete ``step_*`` directories (all of them, newest
    first, when there is no readable ``latest``). A checkpoint that
    fails :func:`checkpoint_problem` is skipped with a warning naming it and why. ``load_root`` may also be a
    step directory itself."""
    root = Path(load_root)
    if not root.is_dir():
        raise FileNotFoundError(f"--load: checkpoint directory not found: {root}")
    if (root / "trainer_state.json").is_file() and step is None:
        problem = checkpoint_problem(root)
        if problem:
            raise ValueError(f"--load {root}: checkpoint is incomplete or corrupt: {problem}")
        return _step_of_dir(root), root
    dirs = _step_dirs(root)
    if step is not None:
        d = root / step_dir_name(step)
        problem = checkpoint_problem(d) if d.is_dir() else "not found"
        if problem:
            raise FileNotFoundError(f"{d}: checkpoint for step {step} cannot be loaded: {problem}")
        return int(step), d
    latest = _latest_step(root)
    if not dirs:
        text = (root / "latest").read_text().strip() if (root / "latest").is_file() else None
        if text is not None and not text.isdigit():
            raise ValueError(f"{root / 'latest'}: expected a step number, got {text!r} (and no step_* dir)")
        raise FileNotFoundError(f"{root}: no checkpoint (no step_* directory; 'latest' says {text})")
    order = sorted(dirs, reverse=True)
    if latest is not None and latest in dirs:   # `latest` is the commit point: a newer dir was never committed
        newer = [s for s in order if s > latest]
        if newer:
            log.warning("%s: ignoring step(s) %s newer than 'latest' (%d): written but not committed", root,
                        newer, latest)
        order = [s for s in order if s <= latest]
    skipped = []
    for s in order:
        problem = checkpoint_problem(dirs[s])
        if problem is None:
            if skipped:
                log.warning("%s: loading step %d after skipping %s", root, s, "; ".join(skipped))
            return s, dirs[s]
        msg = f"{dirs[s]} ({problem})"
        log.warning("skipping checkpoint %s; trying the previous one", msg)
        skipped.append(msg)
    detail = f"; skipped: {'; '.join(skipped)}" if skipped else ""
    raise FileNotFoundError(f"{root}: no checkpoint that can be loaded{detail}")


def load_checkpoint(load_root, trainer, step: Optional[int] = None) -> tuple[int, dict]:
    """Restore ``trainer`` from the newest complete (or the given) checkpoint; returns ``(step, loop_state)``."""
    s, d = resolve_step_dir(load_root, step)
    state = _read_state(d)   # before the trainer: a state that does not parse must not leave it half-loaded
    trainer.load(d)
    return s, state


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def clean_stale_temp(save_root) -> tuple[int, int]:
    """Remove what interrupted writes left in ``save_root`` (``.tmp-NAME-PID`` and ``.old-NAME-PID``
    directories, ``.latest.tmp-PID`` files: the names slick's atomic writes use, ``output_dirs.TEMP_ENTRY``);
    logs each removal with its size. Call it only when no other process writes there (the start of a run).
    Returns (entries removed, bytes freed)."""
    root = Path(save_root)
    if not root.is_dir():
        return 0, 0
    count = freed = 0
    for p in sorted(root.iterdir()):
        if not TEMP_ENTRY.match(p.name):
            continue
        n = _size(p)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        count, freed = count + 1, freed + n
        log.warning("removed %s left by an interrupted checkpoint write (%d bytes)", p, n)
    if count:
        log.warning("%s: removed %d stale temp entr%s, %d bytes in all", root, count, "y" if count == 1 else "ies",
                    freed)
    return count, freed


def retained_steps(steps, keep_last: Optional[int], keep_every: Optional[int]) -> set[int]:
    """Which of ``steps`` retention keeps: the newest ``keep_last`` (1 when only ``keep_every`` is set, as
    Megatron's --save-retain-interval), plus every step that is a multiple of ``keep_every``; neither set:
    all of them."""
    steps = sorted(steps)
    if not keep_last and not keep_every:
        return set(steps)
    keep = set(steps[-(keep_last or 1):])
    if keep_every:
        keep |= {s for s in steps if s % keep_every == 0}
    return keep


def prune_checkpoints(save_root, keep_last: Optional[int], keep_every: Optional[int] = None) -> list[int]:
    """Delete the checkpoints retention does not keep (:func:`retained_steps`; the one ``latest`` names is
    always kept; a ``step_*`` directory without ``trainer_state.json`` is not slick's and never deleted). Each
    is renamed to ``.tmp-delete-*`` first, so a reader never sees half of one. Returns the deleted steps."""
    root = Path(save_root)
    dirs = {s: p for s, p in _step_dirs(root).items() if is_checkpoint_step(p)}
    keep = retained_steps(dirs, keep_last, keep_every)
    latest = _latest_step(root)
    if latest is not None:
        keep.add(latest)
    deleted = []
    for s in sorted(set(dirs) - keep):
        doomed = root / f".tmp-delete-{dirs[s].name}-{os.getpid()}"
        os.replace(dirs[s], doomed)
        shutil.rmtree(doomed, ignore_errors=True)
        deleted.append(s)
    if deleted:
        log.info("%s: removed checkpoints of steps %s (--keep-checkpoints %s, --save-retain-interval %s)",
                 root, deleted, keep_last, keep_every)
    return deleted


def save_hf(out_dir, trainer) -> Path:
    """Write an HF model directory (safetensors, config, generation config, tokenizer) atomically, marked as
    slick's export; an existing ``out_dir`` must be empty or a previous export (OutputDirError otherwise)."""
    return write_dir_atomic(out_dir, trainer.save_hf_files, kind=HF_EXPORT)

"""Where slick may write: no write removes what slick did not create.

An output directory is replaced as a whole (temp dir + rename, ``slick.ckpt.checkpoint.write_dir_atomic``),
so slick writes one only where that deletes nothing of anyone else's:

* a new directory, or an empty one;
* or one slick recognises as its own output of the same kind:

  ``hf-export`` (``--save-hf``, ``slick export``)
      holds ``.slick-output.json`` with ``{"kind": "hf-export"}``, written into every export. An HF directory
      without it (a downloaded model, ``--hf-checkpoint``, an export by an older slick) is not slick's.
  ``checkpoint-root`` (``--save``)
      holds a ``latest`` file with a step number or a ``step_*`` directory with ``trainer_state.json``, or only
      the temp entries interrupted writes leave (:data:`TEMP_ENTRY`: ``.tmp-NAME-PID``, ``.old-NAME-PID``,
      ``.latest.tmp-PID``). This is how checkpoints of every slick version look (no marker), so ``--save DIR``
      of an earlier run resumes into it. Within it slick creates, replaces and (retention) removes only
      ``step_*`` directories holding ``trainer_state.json``, ``latest`` and those temp entries.
  ``checkpoint-step``
      a ``step_*`` directory with ``trainer_state.json`` (rewritten when a step is saved again).
  ``weights``
      the disk weight-sync directory (``RUN_DIR/weights``): holds ``slick_weights.json``.

A target inside a checkpoint, a run directory (``metrics.jsonl``) or an HF export of slick's is refused as
well, and so is one that overlaps (is, is inside, or contains) another path of the run: ``--save``,
``--save-hf`` and the run directory are disjoint, and none overlaps ``--hf-checkpoint``, ``--ref-load``,
``--critic-load`` or ``--load`` (``--load`` may be ``--save`` or a step inside it: a resume writes into its own
checkpoint directory).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Optional
from slick.config import Config

MARKER = ".slick-output.json"
HF_EXPORT, CHECKPOINT_ROOT, CHECKPOINT_STEP, WEIGHTS = "hf-export", "checkpoint-root", "checkpoint-step", "weights"
STEP_PREFIX = "step_"
TRAINER_MARKER = "trainer_state.json"
WEIGHTS_MARKER = "slick_weights.json"
# temp entries of slick's own atomic writes (slick.ckpt.checkpoint): .tmp-NAME-PID, .tmp-NAME-ranks,
# .tmp-delete-NAME-PID, .old-NAME-PID, .latest.tmp-PID
TEMP_ENTRY = re.compile(r"^\.(tmp|old)-.+-(\d+|ranks)$|^\.latest\.tmp-\d+$")
WHAT = {HF_EXPORT: "an HF export", CHECKPOINT_ROOT: "checkpoints", CHECKPOINT_STEP: "a checkpoint",
        WEIGHTS: "synced weights"}


class OutputDirError(ValueError):
    """An output directory would replace or sit inside data slick did not write; nothing was written."""


def write_marker(d, kind: str) -> None:
    """Mark ``d`` as slick's output of ``kind`` (:data:`MARKER`)."""
    (Path(d) / MARKER).write_text(json.dumps({"kind": kind, "written_by": "slick"}) + "\n")


def marker_kind(d) -> Optional[str]:
    """The kind in ``d``'s :data:`MARKER`, or None (no marker, or one that does not parse)."""
    f = Path(d) / MARKER
    try:
        kind = json.loads(f.read_text()).get("kind") if f.is_file() else None
    except (ValueError, OSError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def is_checkpoint_step(d) -> bool:
    return (Path(d) / TRAINER_MARKER).is_file()


def _step_checkpoints(d: Path) -> list[Path]:
    return [p for p in d.glob(f"{STEP_PREFIX}*") if p.name[len(STEP_PREFIX):].isdigit() and is_checkpoint_step(p)]


def _latest_names_a_step(d: Path) -> bool:
    try:
        return (d / "latest").is_file() and (d / "latest").read_text().strip().isdigit()
    except OSError:
        return False


def is_checkpoint_root(d) -> bool:
    """``d`` holds slick checkpoints: a ``latest`` naming a step, or a ``step_*`` dir with ``trainer_state.json``."""
    d = Path(d)
    return d.is_dir() and (_latest_names_a_step(d) or bool(_step_checkpoints(d)))


def is_run_dir(d) -> bool:
    """``d`` is a run directory (``metrics.jsonl``, or the ``config.yaml`` + ``config.json`` a run starts with)."""
    d = Path(d)
    return (d / "metrics.jsonl").is_file() or ((d / "config.yaml").is_file() and (d / "config.json").is_file())


def _entries(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def owned(d, kind: str) -> bool:
    """``d`` (an existing directory) is slick's output of ``kind``, or empty: replacing it deletes nothing else."""
    d = Path(d)
    names = _entries(d)
    if not names:
        return True
    if kind == HF_EXPORT:
        return marker_kind(d) == HF_EXPORT
    if kind == CHECKPOINT_ROOT:
        return is_checkpoint_root(d) or all(TEMP_ENTRY.match(n) for n in names)
    if kind == CHECKPOINT_STEP:
        return is_checkpoint_step(d)
    if kind == WEIGHTS:
        return (d / WEIGHTS_MARKER).is_file() or marker_kind(d) == WEIGHTS
    raise ValueError(f"unknown output kind {kind!r}")


def describe(d) -> str:
    """What ``d`` (an existing, non-empty directory) is, for error messages."""
    d = Path(d)
    kind = marker_kind(d)
    if kind:
        return f"a slick output of kind '{kind}' ({MARKER})"
    if is_checkpoint_step(d):
        return f"a slick checkpoint ({TRAINER_MARKER})"
    if is_checkpoint_root(d):
        return "a slick checkpoint directory ('latest', step_*)"
    if is_run_dir(d):
        return "a slick run directory (metrics.jsonl, config.yaml)"
    if (d / "config.json").is_file():
        return f"a model directory not written by slick export (config.json, no {MARKER})"
    names = _entries(d)
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"a non-empty directory slick did not write (holds {shown})"


def _container(d: Path) -> Optional[str]:
    """What kind of slick data ``d`` is, when writing inside it is refused."""
    if is_checkpoint_step(d):
        return f"the checkpoint {d}"
    if is_checkpoint_root(d):
        return f"the checkpoint directory {d}"
    if is_run_dir(d):
        return f"the run directory {d}"
    if marker_kind(d) == HF_EXPORT:
        return f"the slick HF export {d}"
    return None


def target_problem(target, kind: str, flag: str) -> Optional[str]:
    """Why ``target`` cannot receive an output of ``kind`` (None: it can). ``flag`` names it in the message."""
    p = Path(target).expanduser()
    for parent in p.resolve().parents:
        inside = _container(parent)
        if inside:
            return (f"{flag} {target}: inside {inside}; slick does not write {WHAT[kind]} into another output "
                    f"(choose a directory outside it)")
    if p.exists() and not p.is_dir():
        return f"{flag} {target}: exists and is not a directory"
    if p.is_dir() and not owned(p, kind):
        same = {HF_EXPORT: f"a previous slick HF export ({MARKER})",
                CHECKPOINT_ROOT: "a checkpoint directory of an earlier run ('latest', step_*)"}.get(kind, "its own")
        return (f"{flag} {target}: refusing to write {WHAT[kind]} there: it is {describe(p)}, and writing would "
                f"delete what it holds. slick writes {WHAT[kind]} only into a new or empty directory or {same}; "
                f"choose another directory (or remove this one yourself)")
    return None


def _resolved(path) -> Path:
    return Path(path).expanduser().resolve()


def overlap(a, b) -> Optional[str]:
    """How paths ``a`` and ``b`` overlap: "the same directory", "inside", "contains", or None."""
    ra, rb = _resolved(a), _resolved(b)
    if ra == rb:
        return "the same directory"
    if rb in ra.parents:
        return "inside"
    if ra in rb.parents:
        return "contains"
    return None


def _overlap_message(fa: str, a, fb: str, b, how: str, why: str) -> str:
    rel = {"the same directory": "is the same directory as", "inside": "is inside", "contains": "contains"}[how]
    return f"{fa} {a} {rel} {fb} {b}: they must not overlap ({why})"


BOTH_OUTPUTS = "each write would replace or mix with the other"
OUTPUT_INPUT = "writing the output would replace or change the input"


def export_problems(ckpt_dir, out_dir) -> list[str]:
    """``slick export CKPT OUT``: OUT must not overlap CKPT and must be free for an HF export."""
    how = overlap(out_dir, ckpt_dir)
    if how:
        return [_overlap_message("OUT_DIR", out_dir, "CKPT_DIR", ckpt_dir, how, OUTPUT_INPUT)]
    problem = target_problem(out_dir, HF_EXPORT, "OUT_DIR")
    return [problem] if problem else []


DEFAULT_RUN_DIR = "runs/<time>"


def config_problems(cfg: Config, check_files: bool = True) -> list[str]:
    """The run's paths (``slick.configure.validate``): outputs disjoint from each other and from the inputs;
    with ``check_files``, ``--save`` and ``--save-hf`` free for their kind (:func:`target_problem`)."""
    run_dir = ("--run-dir", cfg.run_dir) if cfg.run_dir else ("--run-dir (default)", DEFAULT_RUN_DIR)
    outputs = [(f, v) for f, v in (("--save", cfg.save), ("--save-hf", cfg.save_hf)) if v] + [run_dir]
    inputs = [(f, v) for f, v in (("--hf-checkpoint", cfg.hf_checkpoint), ("--load", cfg.load),
                                  ("--ref-load", cfg.ref_load), ("--critic-load", cfg.critic_load)) if v]
    p = []
    for i, (fa, a) in enumerate(outputs):
        for fb, b in outputs[i + 1:]:
            how = overlap(a, b)
            if how:
                p.append(_overlap_message(fa, a, fb, b, how, BOTH_OUTPUTS))
        for fb, b in inputs:
            how = overlap(a, b)
            resume = fa == "--save" and fb == "--load" and how in ("the same directory", "contains")
            if how and not resume:
                p.append(_overlap_message(fa, a, fb, b, how, OUTPUT_INPUT))
    if check_files:
        for flag, kind, value in (("--save", CHECKPOINT_ROOT, cfg.save), ("--save-hf", HF_EXPORT, cfg.save_hf)):
            problem = target_problem(value, kind, flag) if value else None
            if problem:
                p.append(problem)
    return p


def file_target_problem(target, flag: str, inputs: list[tuple[str, str]], own: Callable[[Path], bool]) -> Optional[str]:
    """Why the output file ``target`` cannot be written (None: it can): it is a directory, its directory is
    missing, it is one of ``inputs`` (``[(flag, path)]``), or it exists and ``own`` does not recognise it as
    slick's output (a file slick did not write is never replaced)."""
    p = Path(target).expanduser()
    for in_flag, path in inputs:
        if path and (_resolved(p) == _resolved(path) or (p.exists() and Path(path).exists()
                                                        and p.samefile(path))):
            return f"{flag} {target} is the {in_flag} file: {OUTPUT_INPUT}; choose another file"
    if p.is_dir():
        return f"{flag} {target}: is a directory; give a file path (e.g. {p / 'scored.jsonl'})"
    if not p.parent.resolve().is_dir():
        return f"{flag} {target}: the directory {p.parent} does not exist"
    if p.exists() and not (p.is_file() and own(p)):
        return (f"{flag} {target}: exists and was not written by slick; slick writes only a new file or one "
                f"it wrote itself. Choose another file (or remove this one yourself)")
    return None

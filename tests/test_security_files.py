"""Issue 30, findings 1 and 5: no write deletes data slick did not create; no checkpoint file runs code.

Finding 1: `slick export`, --save-hf and --save refuse (at start, by name) a target that is a checkpoint, is
inside one, is the run directory or the input model, or is a non-empty directory slick did not write; the
refused target is left byte for byte as it was. Finding 5: every checkpoint .pt loads with weights_only=True;
a pickle that would call os.system / open is refused with an error naming the file, and never runs.
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.ckpt import checkpoint as ckpt
from slick.ckpt.checkpoint import load_checkpoint, save_checkpoint, save_hf
from slick.ckpt.export import main as export_main
from slick.ckpt.output_dirs import MARKER, OutputDirError
from slick.ckpt.safe_load import UnsafeCheckpointError
from slick.train.trainer import Trainer
from tests.test_train import make_cfg, make_samples, simple_loss
from tests.batches import batch_of

REPO = Path(__file__).resolve().parent.parent


def _step(tr, samples):
    return tr.train_step(batch_of(samples, [torch.ones(len(s.response_ids)) for s in samples]), simple_loss)


def snapshot(root: Path) -> dict:
    """Every file and directory under ``root`` (itself included), files by their sha256."""
    out = {".": "dir"}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


@pytest.fixture(scope="module")
def ckpt_source(tiny_model_dir, tmp_path_factory):
    """A checkpoint root of three steps (different weights each), written by the current code."""
    root = tmp_path_factory.mktemp("ck-src") / "ck"
    tr = Trainer(make_cfg(tiny_model_dir, lr=1e-2))
    samples = make_samples(3)
    for s in (1, 2, 3):
        _step(tr, samples)
        save_checkpoint(root, s, tr, {"cursor": s})
    return root


@pytest.fixture()
def ck(ckpt_source, tmp_path):
    dst = tmp_path / "ck"
    shutil.copytree(ckpt_source, dst)
    return dst


def foreign_dir(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "notes.txt").write_text("my notes\n")
    (path / "sub" / "data.csv").write_bytes(b"a,b\n1,2\n")
    return path


# ---------------------------------------------------------------- finding 1: slick export


def test_export_onto_the_checkpoint_root_is_refused(ck, capsys):
    before = snapshot(ck)
    assert export_main([str(ck), str(ck)]) == 2
    err = capsys.readouterr().err
    assert f"slick export: error: OUT_DIR {ck} is the same directory as CKPT_DIR {ck}" in err
    assert snapshot(ck) == before                                     # every step_* and latest survive
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_000001", "step_000002", "step_000003"]


def test_export_onto_a_step_directory_is_refused(ck, capsys):
    before = snapshot(ck)
    target = ck / "step_000003"
    assert export_main([str(ck), str(target)]) == 2
    assert f"OUT_DIR {target} is inside CKPT_DIR {ck}" in capsys.readouterr().err
    assert snapshot(ck) == before


def test_export_onto_a_foreign_directory_keeps_its_files(ck, tmp_path, capsys):
    d = foreign_dir(tmp_path / "d")
    before = snapshot(d)
    assert export_main([str(ck), str(d)]) == 2
    err = capsys.readouterr().err
    assert (f"OUT_DIR {d}: refusing to write an HF export there: it is a non-empty directory slick did not "
            f"write (holds notes.txt, sub)") in err
    assert snapshot(d) == before
    assert (d / "notes.txt").read_bytes() == b"my notes\n" and (d / "sub" / "data.csv").read_bytes() == b"a,b\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "d"]   # no temp dir left beside it


def test_export_onto_a_model_it_did_not_write_is_refused(ck, tiny_model_dir, tmp_path, capsys):
    model = tmp_path / "base"
    shutil.copytree(tiny_model_dir, model)
    before = snapshot(model)
    assert export_main([str(ck), str(model)]) == 2
    assert f"a model directory not written by slick export (config.json, no {MARKER})" in capsys.readouterr().err
    assert snapshot(model) == before


def test_export_cli_refusal_exit_code_in_a_subprocess(ck):
    before = snapshot(ck)
    proc = subprocess.run([sys.executable, "-m", "slick.cli", "export", str(ck), str(ck / "step_000001")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"OUT_DIR {ck / 'step_000001'} is inside CKPT_DIR {ck}" in proc.stderr
    assert snapshot(ck) == before


def test_reexport_onto_a_previous_export_succeeds(ck, tmp_path, capsys):
    out = tmp_path / "exp"
    assert export_main([str(ck), str(out)]) == 0
    assert json.loads((out / MARKER).read_text()) == {"kind": "hf-export", "written_by": "slick"}
    step3 = (ck / "step_000003" / "model" / "model.safetensors").read_bytes()
    assert (out / "model.safetensors").read_bytes() == step3
    assert export_main([str(ck), str(out), "--step", "2"]) == 0           # replaces its own export
    step2 = (ck / "step_000002" / "model" / "model.safetensors").read_bytes()
    assert step2 != step3 and (out / "model.safetensors").read_bytes() == step2
    # a new directory inside a foreign one is fine: nothing there is replaced
    d = foreign_dir(tmp_path / "d")
    assert export_main([str(ck), str(d / "hf")]) == 0
    assert (d / "hf" / "model.safetensors").read_bytes() == step3 and (d / "notes.txt").is_file()


def test_save_hf_api_refuses_a_foreign_directory(ck, tiny_model_dir, tmp_path):
    tr = Trainer(make_cfg(tiny_model_dir))
    d = foreign_dir(tmp_path / "d")
    before = snapshot(d)
    with pytest.raises(OutputDirError, match=r"refusing to replace it with hf-export: it is a non-empty directory"):
        save_hf(d, tr)
    assert snapshot(d) == before
    out = save_hf(tmp_path / "hf", tr)
    save_hf(out, tr)                                                      # its own export: replaced
    assert (out / MARKER).is_file() and (out / "model.safetensors").is_file()


# ---------------------------------------------------------------- finding 1: the run's flags, at validation


@pytest.fixture()
def run_files(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1?", "label": "2"}) + "\n")
    return dict(hf_checkpoint=str(tiny_model_dir), prompt_data=str(prompts), rm_type="exact",
                run_dir=str(tmp_path / "run"), dtype="fp32", device="cpu")


def problems(**values) -> list[str]:
    try:
        validate_config(Config.from_flat(values))
    except ConfigError as e:
        return e.problems
    return []


def _train_main(argv):
    from slick.loop.sync import main

    return main(argv)


def _argv(values: dict) -> list[str]:
    out = []
    for k, v in values.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out + ["--num-rollout", "1", "--no-progress"]


def test_save_equal_to_save_hf_is_refused_before_training(run_files, tmp_path, capsys):
    ck = str(tmp_path / "ck")
    assert _train_main(_argv({**run_files, "save": ck, "save_hf": ck})) == 2
    err = capsys.readouterr().err
    assert f"--save {ck} is the same directory as --save-hf {ck}: they must not overlap" in err
    assert not (tmp_path / "ck").exists() and not (tmp_path / "run").exists()   # nothing ran


def test_save_hf_equal_to_the_run_directory_is_refused(run_files, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "rollouts" / "step_00000001.parquet").write_bytes(b"PAR1 fake")
    before = snapshot(run)
    assert _train_main(_argv({**run_files, "save_hf": str(run)})) == 2
    err = capsys.readouterr().err
    assert f"--save-hf {run} is the same directory as --run-dir {run}: they must not overlap" in err
    assert f"--save-hf {run}: refusing to write an HF export there: it is a slick run directory" in err
    assert snapshot(run) == before


def test_save_hf_equal_to_hf_checkpoint_is_refused(run_files, tiny_model_dir, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    before = snapshot(base)
    assert _train_main(_argv({**run_files, "hf_checkpoint": str(base), "save_hf": str(base)})) == 2
    err = capsys.readouterr().err
    assert (f"--save-hf {base} is the same directory as --hf-checkpoint {base}: they must not overlap (writing "
            f"the output would replace or change the input)") in err
    assert snapshot(base) == before and not (tmp_path / "run").exists()


def test_overlapping_outputs_and_inputs_are_named(run_files, tmp_path):
    ck, run = tmp_path / "ck", tmp_path / "run"
    got = problems(**run_files, save=str(ck), save_hf=str(ck / "hf"))
    assert got == [f"--save {ck} contains --save-hf {ck / 'hf'}: they must not overlap (each write would replace "
                   f"or mix with the other)"]
    got = problems(**run_files, save=str(run / "ck"))
    assert any(m.startswith(f"--save {run / 'ck'} is inside --run-dir {run}") for m in got), got
    got = problems(**run_files, load=str(run), save=str(ck))
    assert any(m.startswith(f"--run-dir {run} is the same directory as --load {run}") for m in got), got
    got = problems(**{**run_files, "run_dir": None}, save_hf="runs")
    assert any(m.startswith("--save-hf runs contains --run-dir (default) runs/<time>") for m in got), got


def test_save_into_earlier_checkpoints_and_load_from_them_is_accepted(run_files, ck, tmp_path):
    assert problems(**run_files, save=str(ck), load=str(ck)) == []              # the resume case
    assert problems(**run_files, save=str(ck), load=str(ck / "step_000002")) == []
    assert problems(**run_files, save=str(tmp_path / "new"), save_hf=str(tmp_path / "hf")) == []
    (tmp_path / "empty").mkdir()
    assert problems(**run_files, save=str(tmp_path / "empty")) == []


def test_save_onto_foreign_data_or_into_a_checkpoint_is_refused(run_files, ck, tmp_path):
    d = foreign_dir(tmp_path / "d")
    got = problems(**run_files, save=str(d))
    assert got == [f"--save {d}: refusing to write checkpoints there: it is a non-empty directory slick did not "
                   f"write (holds notes.txt, sub), and writing would delete what it holds. slick writes checkpoints "
                   f"only into a new or empty directory or a checkpoint directory of an earlier run ('latest', "
                   f"step_*); choose another directory (or remove this one yourself)"]
    got = problems(**run_files, save=str(ck / "step_000003"))
    assert got and got[0].startswith(f"--save {ck / 'step_000003'}: inside the checkpoint directory {ck}")
    got = problems(**run_files, save_hf=str(ck / "step_000003" / "hf"))
    assert got and got[0].startswith(f"--save-hf {ck / 'step_000003' / 'hf'}: inside the checkpoint "
                                     f"{ck / 'step_000003'}")


def test_resume_into_a_checkpoint_root_of_an_older_slick(ck, tiny_model_dir):
    """A root without any marker (what every slick wrote so far) takes new checkpoints; retention and the
    stale-temp cleanup leave what is not slick's alone."""
    assert not list(ck.rglob(MARKER))
    (ck / "step_000009").mkdir()                                  # not a checkpoint: no trainer_state.json
    (ck / "step_000009" / "mine.txt").write_text("keep")
    (ck / ".tmp-notes").write_text("keep")                        # not a name slick's writes use
    (ck / ".tmp-step_000004-123").mkdir()                         # an interrupted write of slick's
    assert ckpt.clean_stale_temp(ck) == (1, 0)
    tr = Trainer(make_cfg(tiny_model_dir))
    step, _ = load_checkpoint(ck, tr)
    save_checkpoint(ck, step + 1, tr, {"cursor": 4}, keep_last=1)
    assert sorted(p.name for p in ck.iterdir()) == [".tmp-notes", "latest", "step_000004", "step_000009"]
    assert (ck / "step_000009" / "mine.txt").read_text() == "keep"


def test_save_checkpoint_api_refuses_a_foreign_root(tiny_model_dir, tmp_path):
    d = foreign_dir(tmp_path / "d")
    before = snapshot(d)
    with pytest.raises(OutputDirError, match=r"--save .*: it is a non-empty directory slick did not write"):
        save_checkpoint(d, 1, Trainer(make_cfg(tiny_model_dir)), {})
    assert snapshot(d) == before


# ---------------------------------------------------------------- finding 5: no checkpoint runs code


class RunsShell:
    """Unpickling this calls os.system: it creates ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


class OpensFile:
    """Unpickling this calls open(path, "w"): it creates ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _plant(step_dir: Path, name: str, payload) -> Path:
    """Replace ``step_dir/name`` by a pickle carrying ``payload``; keep the manifest consistent so that only the
    safe load stands between the file and the run."""
    target = step_dir / name
    if name == "state.pt":
        (step_dir / "state.json").unlink()
    torch.save({"python": payload, "numpy": payload, "torch": payload, "state": payload}, target)
    ckpt.write_manifest(step_dir)
    assert ckpt.checkpoint_problem(step_dir) is None
    return target


@pytest.mark.parametrize("name", ["rng.pt", "state.pt", "optimizer.pt", "scheduler.pt"])
@pytest.mark.parametrize("gadget", [RunsShell, OpensFile])
def test_a_malicious_checkpoint_file_is_refused_by_name_and_never_runs(ck, tiny_model_dir, tmp_path, name,
                                                                      gadget):
    marker = tmp_path / "pwned"
    bad = _plant(ck / "step_000003", name, gadget(marker))
    tr = Trainer(make_cfg(tiny_model_dir))
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint(ck, tr)
    msg = str(e.value)
    called = "posix.system" if gadget is RunsShell else "io.open"
    assert msg.startswith(f"{bad}: refused to load: the file holds more than tensors and plain data (it calls or "
                          f"builds {called}); loading it would run code stored in the checkpoint.")
    assert not marker.exists()


def test_export_reads_no_pickle_even_when_rng_pt_is_malicious(ck, tmp_path):
    """`slick export` copies model/ (safetensors): it needs no pickle at all, even when rng.pt is malicious."""
    marker = tmp_path / "pwned"
    _plant(ck / "step_000003", "rng.pt", RunsShell(marker))
    assert export_main([str(ck), str(tmp_path / "out")]) == 0
    assert not marker.exists()


def test_checkpoints_of_the_current_format_and_the_older_rng_format_restore_exactly(ck, tiny_model_dir):
    """rng.pt now holds tensors and plain data; one written by the previous code (numpy's get_state tuple with
    an ndarray) still loads with weights_only=True and restores the same draws."""
    d = ck / "step_000003"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(d / "rng.pt")) == []
    random.seed(5), np.random.seed(6), torch.manual_seed(7)
    np.random.randn()                                              # a cached gaussian in numpy's state
    torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
               d / "rng.pt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(d / "rng.pt")) != []   # the old layout
    ckpt.write_manifest(d)
    want = (random.random(), float(np.random.randn()), float(np.random.rand()), torch.rand(3).tolist())
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    tr = Trainer(make_cfg(tiny_model_dir))
    assert load_checkpoint(ck, tr) == (3, {"cursor": 3})
    assert (random.random(), float(np.random.randn()), float(np.random.rand()), torch.rand(3).tolist()) == want


def test_loop_state_as_state_pt_round_trips_and_unloadable_state_is_refused_at_save(ck, tiny_model_dir):
    tr = Trainer(make_cfg(tiny_model_dir))
    state = {"t": torch.arange(4), "np": np.int32(3), "n": [1, 2]}
    d = save_checkpoint(ck, 7, tr, state)
    assert (d / "state.pt").is_file() and not (d / "state.json").is_file()
    _, got = load_checkpoint(ck, tr)
    assert torch.equal(got["t"], torch.arange(4)) and got["np"] == 3 and type(got["np"]) is int and got["n"] == [1, 2]
    with pytest.raises(ValueError, match=r"the loop state of this checkpoint holds .*Path"):
        save_checkpoint(ck, 8, tr, {"t": torch.zeros(1), "where": Path("/x")})
    assert (ck / "latest").read_text() == "7\n" and not (ck / "step_000008").exists()


def test_no_torch_load_bypasses_the_safe_loader():
    """Every torch.load call in slick/ is the one in slick/ckpt/safe_load.py (weights_only=True), and no call
    anywhere passes weights_only=False."""
    import ast

    calls, unsafe = [], []
    for path in sorted((REPO / "slick").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "load" and isinstance(f.value, ast.Name) \
                    and f.value.id == "torch":
                calls.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if any(k.arg == "weights_only" and not (isinstance(k.value, ast.Constant) and k.value.value is True)
                   for k in node.keywords):
                unsafe.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert [c for c in calls if not c.startswith("slick/ckpt/safe_load.py:")] == [] and len(calls) == 2
    assert unsafe == []

"""--hf-checkpoint / --ref-load are checked as local model directories before anything loads; slick never
downloads (the CLI sets HF_HUB_OFFLINE), and a bad directory is a plain message with exit code 2."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slick.config import Config, ConfigError
from slick.configure.validate import validate_config
from slick.models.check import model_dir_problems, read_model_config
from tests.hf_dirs import write_model_dir

ROOT = Path(__file__).resolve().parents[1]


def test_a_complete_directory_has_no_problems(tmp_path, tiny_model_dir):
    assert model_dir_problems(str(tiny_model_dir)) == []              # what make_tiny_model really writes
    assert model_dir_problems(str(write_model_dir(tmp_path / "m"))) == []


def test_missing_directory_and_hub_style_name(tmp_path):
    assert model_dir_problems(str(tmp_path / "nope")) == [f"--hf-checkpoint {tmp_path / 'nope'}: directory does not exist"]
    (p,) = model_dir_problems("some/model", "--ref-load")
    assert p.startswith("--ref-load some/model: directory does not exist") and "never downloads" in p
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert model_dir_problems(str(f)) == [f"--hf-checkpoint {f}: is not a directory (pass a Hugging Face model directory)"]


def test_empty_directory_lists_everything_missing(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    problems = model_dir_problems(str(d))
    assert problems == [
        f"--hf-checkpoint {d}: lacks config.json",
        f"--hf-checkpoint {d}: lacks weights (*.safetensors or pytorch_model.bin)",
        f"--hf-checkpoint {d}: lacks a tokenizer (tokenizer.json or tokenizer.model or vocab.json or vocab.txt; "
        f"tokenizer_config.json alone is not enough)",
    ]
    # a reference model needs no tokenizer
    assert len(model_dir_problems(str(d), "--ref-load", tokenizer=False)) == 2


def test_each_missing_part_alone(tmp_path):
    (p,) = model_dir_problems(str(write_model_dir(tmp_path / "a", config=False)))
    assert p.endswith("lacks config.json")
    (p,) = model_dir_problems(str(write_model_dir(tmp_path / "b", weights=False)))
    assert p.endswith("lacks weights (*.safetensors or pytorch_model.bin)")
    d = write_model_dir(tmp_path / "c", tokenizer=False)
    (d / "tokenizer_config.json").write_text("{}")
    (p,) = model_dir_problems(str(d))
    assert "lacks a tokenizer" in p
    d = write_model_dir(tmp_path / "d", weights=False)
    (d / "pytorch_model.bin").write_bytes(b"")
    assert model_dir_problems(str(d)) == []


def test_sharded_index_names_missing_shards(tmp_path):
    d = write_model_dir(tmp_path / "m", weights=False)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    (d / "model-00001-of-00002.safetensors").write_bytes(b"")
    (p,) = model_dir_problems(str(d))
    assert p == (f"--hf-checkpoint {d}: model.safetensors.index.json lists weight files that are missing: "
                 f"model-00002-of-00002.safetensors")
    (d / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert model_dir_problems(str(d)) == []


def test_broken_config_json_names_file_and_line(tmp_path):
    d = write_model_dir(tmp_path / "m")
    (d / "config.json").write_text('{\n  "hidden_size": 64,\n  oops\n}')
    (p,) = model_dir_problems(str(d))
    assert p.startswith(f"--hf-checkpoint {d}: {d / 'config.json'}: invalid JSON at line 3")
    (d / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="top level must be a JSON object"):
        read_model_config(d)


def _cfg(tmp_path, **kw):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    return Config.from_flat({"prompt_data": str(data), **kw})


def test_validate_config_checks_hf_checkpoint_and_ref_load(tmp_path):
    good = str(write_model_dir(tmp_path / "good"))
    with pytest.raises(ConfigError) as e:
        validate_config(_cfg(tmp_path, hf_checkpoint="org/model", ref_load=str(tmp_path / "ref")))
    assert e.value.problems[0].startswith("--hf-checkpoint org/model: directory does not exist")
    assert e.value.problems[1] == f"--ref-load {tmp_path / 'ref'}: directory does not exist"
    assert len(e.value.problems) == 2
    validate_config(_cfg(tmp_path, hf_checkpoint=good, ref_load=str(write_model_dir(tmp_path / "ref", tokenizer=False))))
    validate_config(_cfg(tmp_path, hf_checkpoint="org/model"), check_files=False)   # files unchecked on request


def run_slick(*args, env=None):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "slick.cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=env)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("which", ["hub_name", "missing", "empty"])
def test_slick_train_with_a_bad_model_exits_2_fast_without_traceback(tmp_path, which):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x", "label": "1"}\n')
    (tmp_path / "empty").mkdir()
    model = {"hub_name": "HuggingFaceTB/SmolLM2-135M-Instruct", "missing": str(tmp_path / "missing"),
             "empty": str(tmp_path / "empty")}[which]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB")}   # slick itself goes offline
    r, wall = run_slick("train", "--hf-checkpoint", model, "--prompt-data", str(data), env=env)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert wall < 20, wall       # no network retries (the Hub client retried for ~49 s before)
    want = "lacks config.json" if which == "empty" else "directory does not exist"
    assert f"--hf-checkpoint {model}: {want}" in r.stderr, r.stderr
    assert r.stderr.startswith("slick train: invalid configuration:")


@pytest.mark.parametrize("which", ["hub_name", "empty"])
def test_slick_serve_with_a_bad_model_exits_2_fast_without_traceback(tmp_path, which):
    (tmp_path / "empty").mkdir()
    model = {"hub_name": "HuggingFaceTB/SmolLM2-135M-Instruct", "empty": str(tmp_path / "empty")}[which]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_HUB")}
    r, wall = run_slick("serve", "--hf-checkpoint", model, "--port", "1", env=env)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert wall < 20, wall
    want = "lacks config.json" if which == "empty" else "directory does not exist"
    assert f"--hf-checkpoint {model}: {want}" in r.stderr, r.stderr


def test_cli_sets_hf_hub_offline_unless_given(tmp_path):
    code = ("import os, sys; os.environ.pop('HF_HUB_OFFLINE', None) if sys.argv[1] == 'unset' else "
            "os.environ.__setitem__('HF_HUB_OFFLINE', '0'); from slick.cli import main; "
            "rc = main(['flags', '--write', sys.argv[2]]); "
            "import huggingface_hub.constants as c; print(rc, os.environ['HF_HUB_OFFLINE'], c.HF_HUB_OFFLINE)")
    out = tmp_path / "flags.md"
    for mode, want in (("unset", "0 1 True"), ("given", "0 0 False")):
        r = subprocess.run([sys.executable, "-c", code, mode, str(out)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().splitlines()[-1] == want, r.stdout

"""Estimator and reward-type names have one source: their registries. The parser's choices, the docs and
the validation read them from there, and ``import slick.config`` still does not import torch."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from slick.algo import estimators
from slick.config import Config, ConfigError
from slick.configure import build_parser
from slick.configure.docs import render_markdown
from slick.config.groups import AlgorithmConfig, RewardConfig
from slick.configure.parse import field_help
from slick.configure.validate import validate_config
from slick.reward import registry
from tests.hf_dirs import write_model_dir

ROOT = Path(__file__).resolve().parents[1]


def test_import_slick_config_does_not_import_torch():
    code = ("import sys, slick.config, slick.configure.validate, slick.configure.docs, slick.models.check; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'transformers'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_parser_choices_equal_the_estimator_registry():
    action = build_parser()._option_string_actions["--advantage-estimator"]
    assert action.choices == list(estimators.ESTIMATORS)


def test_a_newly_registered_estimator_appears_in_choices_docs_and_validation(monkeypatch, tmp_path):
    monkeypatch.setitem(estimators.ESTIMATORS, "my_estimator", estimators.ESTIMATORS["grpo"])
    assert "my_estimator" in build_parser()._option_string_actions["--advantage-estimator"].choices
    assert "rloo, my_estimator}" in render_markdown()
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    cfg = Config.from_flat({"prompt_data": str(data), "hf_checkpoint": str(write_model_dir(tmp_path / "m")),
                            "advantage_estimator": "my_estimator"})
    assert validate_config(cfg).advantage_estimator == "my_estimator"
    monkeypatch.delitem(estimators.ESTIMATORS, "my_estimator")
    with pytest.raises(ConfigError, match="unknown --advantage-estimator 'my_estimator'"):
        validate_config(cfg)


def test_rm_type_help_lists_the_reward_registry(monkeypatch):
    rm_field = next(f for f in dataclasses.fields(RewardConfig) if f.name == "rm_type")
    help_ = field_help(rm_field)
    assert help_.startswith("Reward type: " + ", ".join(registry.known_types()) + ", or boxed_<type>")
    monkeypatch.setitem(registry.BUILTIN, "my_rule", registry.BUILTIN["exact"])
    assert "my_rule" in field_help(rm_field)
    assert "my_rule" in build_parser()._option_string_actions["--rm-type"].help


def test_rm_type_validation_follows_the_registry(monkeypatch, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')
    model = str(write_model_dir(tmp_path / "m"))

    def check(rm_type):
        return validate_config(Config.from_flat({"prompt_data": str(data), "hf_checkpoint": model,
                                                 "rm_type": rm_type}))
    with pytest.raises(ConfigError, match="unknown --rm-type 'my_rule'"):
        check("my_rule")
    monkeypatch.setitem(registry.BUILTIN, "my_rule", registry.BUILTIN["exact"])
    check("my_rule")
    check("boxed_my_rule")


def test_no_hand_written_name_lists_remain():
    est_field = next(f for f in dataclasses.fields(AlgorithmConfig) if f.name == "advantage_estimator")
    assert "choices" not in est_field.metadata and est_field.metadata["choices_from"] == "slick.algo.estimators:ESTIMATORS"
    import slick.configure.validate as v
    assert not hasattr(v, "ESTIMATORS") and not hasattr(v, "RM_TYPES")

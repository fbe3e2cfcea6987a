"""slick.models.tokenizer: one tokenizer per model directory, shared by the run's parts."""
import json
import shutil

from slick.models.tokenizer import load_tokenizer
from slick.train.trainer import Trainer
from tests.test_train import make_cfg


def test_one_tokenizer_per_directory_shared_by_trainer_and_engine(tiny_model_dir, tmp_path):
    from slick.engine.local import LocalEngine

    tok = load_tokenizer(tiny_model_dir)
    assert load_tokenizer(str(tiny_model_dir)) is tok
    assert Trainer(make_cfg(tiny_model_dir)).tokenizer is tok
    assert LocalEngine(tiny_model_dir, dtype="fp32").tokenizer is tok
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    other = load_tokenizer(copy)
    assert other is not tok and other.encode("2 + 3") == tok.encode("2 + 3")


def test_a_rewritten_tokenizer_loads_afresh(tiny_model_dir, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    first = load_tokenizer(d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 77
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    second = load_tokenizer(d)
    assert second is not first and second.model_max_length == 77

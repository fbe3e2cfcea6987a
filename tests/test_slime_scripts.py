"""slime's own example scripts through slick's parser (argument lists in tests/slime_scripts.py): every flag parses,
maps, or is refused by name; none ends in a traceback or argparse's usage dump. Plus the run-level rules slime
scripts rely on: --load = --save not there yet starts fresh, flags with no effect in a run say so."""
import json
import logging

import pytest

from slick.config import ConfigError
from slick.configure import parse_config
from slick.configure.parse import build_parser
from tests.slime_scripts import SCRIPTS

# the flags each script's run is refused for on slick (with a tiny local model), each named in its message
REFUSED = {
    "run-qwen3-4B": ["--rollout-num-gpus-per-engine", "--tensor-model-parallel-size", "--num-layers", "--hidden-size",
                     "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups", "--kv-channels", "--vocab-size",
                     "--rotary-base", "--qk-layernorm", "--ref-load"],
    "search-r1/run_qwen2.5_3B": ["--rollout-num-gpus-per-engine", "--tensor-model-parallel-size", "--num-layers",
                                 "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--vocab-size",
                                 "--rotary-base", "--add-qkv-bias", "--ref-load"],
}


@pytest.fixture(scope="module")
def paths(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("slime-scripts")
    ref = tmp / "Qwen3-4B_torch_dist"          # what slime's convert_hf_to_torch_dist.py writes (the file names)
    ref.mkdir()
    for name in (".metadata", "__0_0.distcp", "common.pt"):
        (ref / name).write_text("")
    data = tmp / "train.jsonl"
    data.write_text(json.dumps({"prompt": "What is 1 + 1?", "label": "2", "reward_model": {"ground_truth": "2"}}) + "\n")
    return dict(MODEL=tiny_model_dir, REF=ref, CKPT=tmp / "Qwen3-4B_slime", DATA=data, EVAL=data,
                PLUGIN="tests.slime_plugins")


def argv_of(name, paths):
    return [a.format(**paths) for a in SCRIPTS[name]]


def without(argv, flags):
    """``argv`` with each of ``flags`` and its values removed."""
    out, skip = [], False
    for a in argv:
        if a.startswith("--"):
            skip = a in flags
        if not skip:
            out.append(a)
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_flag_of_the_script_is_known(name, paths):
    known = build_parser()._option_string_actions
    flags = [a for a in argv_of(name, paths) if a.startswith("--")]
    assert [f for f in flags if f not in known and not f.startswith("--sglang-")] == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_is_refused_by_name_only(name, paths):
    with pytest.raises(ConfigError) as e:
        parse_config(argv_of(name, paths))
    named = [line.split()[0] for line in e.value.problems]
    assert sorted(named) == sorted(REFUSED[name])
    assert "torch_dist" in str(e.value) and "drop --ref-load" in str(e.value)


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_rest_of_the_script_runs_as_slime_means_it(name, paths, caplog):
    caplog.set_level(logging.INFO, logger="slick.config")
    cfg = parse_config(without(argv_of(name, paths), set(REFUSED[name])))
    assert (cfg.adam_beta2, cfg.lr, cfg.lr_decay_style, cfg.max_tokens_per_micro_batch) == (0.98, 1e-6, "constant", 9216)
    assert cfg.kl_loss_type == "low_var_kl" and cfg.eps_clip_high == 0.28 and cfg.gradient_checkpointing is True
    assert cfg.attention_dropout == 0.0 and cfg.hidden_dropout == 0.0     # checked against config.json: it has 0
    assert "--attention-backend has no effect in slick" in caplog.text
    assert "--balance-data: accepted" in caplog.text and "--optimizer: accepted" in caplog.text
    if name == "run-qwen3-4B":
        assert cfg.rm_type == "deepscaler" and cfg.load == cfg.save == str(paths["CKPT"])
        assert "holds no checkpoint yet: the run starts fresh" in caplog.text and not paths["CKPT"].exists()
    else:
        assert cfg.custom_generate_function_path == "tests.slime_plugins.generate"


def test_load_equal_to_save_not_there_yet_starts_fresh(tmp_path):
    from slick.loop.build import resume

    cfg = parse_config(["--load", str(tmp_path / "ck"), "--save", str(tmp_path / "ck")], validate=False)
    assert resume(cfg, None, None, None, None) == 0          # nothing is read: the trainer is not even needed


@pytest.mark.parametrize("make,words", [
    (lambda d: None, ["--load", "no such directory", "give --save"]),
    (lambda d: d.mkdir(), ["--load", "a directory without one", "give --save"]),
    (lambda d: (d.mkdir(), (d / "latest_checkpointed_iteration.txt").write_text("20")),
     ["is a Megatron checkpoint (slime's format)", "--hf-checkpoint"]),
])
def test_load_without_a_checkpoint_is_refused_by_name(tiny_model_dir, tmp_path, make, words):
    d = tmp_path / "ck"
    make(d)
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    with pytest.raises(ConfigError) as e:
        parse_config(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data), "--load", str(d)])
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("argv,warning", [
    (["--save-interval", "100"], "--save-interval 100 has no effect without --save DIR"),
    (["--eval-interval", "50"], "--eval-interval 50 has no effect without --eval-prompt-data"),
])
def test_interval_without_its_target_warns(tiny_model_dir, tmp_path, caplog, argv, warning):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    base = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data)]
    parse_config(base)
    assert warning not in caplog.text
    parse_config(base + argv)
    assert warning in caplog.text


@pytest.mark.parametrize("argv,field,value", [
    (["--lr-warmup-fraction", "0.1", "--lr-decay-iters", "50"], "lr_warmup_steps", 5),
    (["--lr-warmup-fraction", "0.25", "--num-rollout", "10", "--rollout-batch-size", "4", "--n-samples-per-prompt",
      "4", "--global-batch-size", "8"], "lr_warmup_steps", 5),          # 10 rollouts x 2 steps
    (["--lr-warmup-fraction", "0.5", "--num-rollout", "6", "--num-steps-per-rollout", "3"], "lr_warmup_steps", 9),
    (["--optimizer", "adam"], "weight_decay", 0.0),
    # a slime script's decaying schedule spans the run's optimizer steps (Megatron's default): 10 x 4 chats / 2
    (["--optimizer", "adam", "--loss-type", "sft_loss", "--lr-decay-style", "cosine", "--num-rollout", "10",
      "--rollout-batch-size", "4", "--global-batch-size", "2"], "lr_decay_iters", 20),
    (["--lr-decay-style", "cosine", "--num-rollout", "10", "--rollout-batch-size", "4", "--global-batch-size", "2",
      "--loss-type", "sft_loss"], "lr_decay_iters", None),             # a slick command: not guessed
    (["--attention-dropout", "0.1"], "attention_dropout", 0.1),
])
def test_megatron_optimizer_flags_map(argv, field, value):
    assert getattr(parse_config(argv, validate=False), field) == value


@pytest.mark.parametrize("argv,words", [
    (["--optimizer", "sgd"], ["--optimizer sgd", "AdamW"]),
    (["--lr-warmup-fraction", "0.1"], ["--lr-warmup-fraction 0.1", "--lr-decay-iters", "--lr-warmup-iters"]),
    (["--lr-warmup-fraction", "0.1", "--lr-decay-iters", "50", "--lr-warmup-steps", "3"], ["disagrees", "give one"]),
    (["--lr-warmup-fraction", "1.5", "--lr-decay-iters", "50"], ["must be in [0, 1]"]),
])
def test_megatron_optimizer_flags_refused_by_name(argv, words):
    with pytest.raises(ConfigError) as e:
        parse_config(argv, validate=False)
    for w in words:
        assert w in str(e.value)


def test_dropout_other_than_the_checkpoints_is_refused(tiny_model_dir, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi", "label": "x"}\n')
    with pytest.raises(ConfigError, match="--attention-dropout 0.1 does not match the checkpoint.*attention_dropout"):
        parse_config(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data), "--attention-dropout", "0.1"])


def test_slimes_fully_async_rollout_is_slick_train_async():
    path = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
    assert parse_config(["--rollout-function-path", path], validate=False, driver="async").rollout_function_path is None
    with pytest.raises(ConfigError, match="is slime's fully-async rollout: run the command with slick train-async"):
        parse_config(["--rollout-function-path", path], validate=False)

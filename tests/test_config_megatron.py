"""Megatron-LM flags a slime user brings: recompute maps to gradient checkpointing, model-shape flags are checked
against config.json (both values shown), parallel sizes above 1 are refused, --sequence-parallel warns."""
import logging

import pytest

from slick.config import ConfigError
from slick.configure import parse_config
from tests.hf_dirs import write_model_dir

# the shape of the tiny Llama that slick.models.tiny writes (tests/hf_dirs.py LLAMA_CONFIG), in Megatron flags
MATCHING = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
            "--group-query-attention", "--num-query-groups", "2", "--kv-channels", "16", "--vocab-size", "49152",
            "--seq-length", "1024", "--max-position-embeddings", "2048", "--rotary-base", "10000",
            "--norm-epsilon", "1e-6", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
            "--use-rotary-position-embeddings", "--swiglu", "--disable-bias-linear"]


@pytest.fixture
def base(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "x"}\n')

    def argv(model=None, **overrides):
        model = model or write_model_dir(tmp_path / "model", **overrides)
        return ["--hf-checkpoint", str(model), "--prompt-data", str(data)]
    return argv


def problems(argv):
    with pytest.raises(ConfigError) as e:
        parse_config(argv)
    return e.value.problems


def test_matching_shape_flags_pass_on_a_real_tiny_checkpoint(base, tiny_model_dir):
    cfg = parse_config(base(tiny_model_dir) + MATCHING)
    assert cfg.num_layers == 2 and cfg.rotary_base == 10000.0 and cfg.megatron.swiglu is True


@pytest.mark.parametrize("flag,value,message", [
    ("--num-layers", "4", "--num-layers 4 does not match the checkpoint: {src} has num_hidden_layers = 2"),
    ("--hidden-size", "128", "--hidden-size 128 does not match the checkpoint: {src} has hidden_size = 64"),
    ("--ffn-hidden-size", "64", "--ffn-hidden-size 64 does not match the checkpoint: {src} has intermediate_size = 128"),
    ("--num-attention-heads", "8", "--num-attention-heads 8 does not match the checkpoint: {src} has "
                                   "num_attention_heads = 4"),
    ("--num-query-groups", "4", "--num-query-groups 4 does not match the checkpoint: {src} has num_key_value_heads = 2"),
    ("--kv-channels", "32", "--kv-channels 32 does not match the checkpoint: {src} has head_dim = 16"),
    ("--vocab-size", "151936", "--vocab-size 151936 does not match the checkpoint: {src} has vocab_size = 49152"),
    ("--seq-length", "4096", "--seq-length 4096 exceeds the checkpoint's max_position_embeddings = 2048 ({src})"),
    ("--max-position-embeddings", "4096", "--max-position-embeddings 4096 exceeds the checkpoint's "
                                          "max_position_embeddings = 2048 ({src})"),
    ("--rotary-base", "1000000", "--rotary-base 1000000.0 does not match the checkpoint: {src} has rope_theta = 10000.0"),
    ("--norm-epsilon", "1e-5", "--norm-epsilon 1e-05 does not match the checkpoint: {src} has rms_norm_eps = 1e-06"),
    ("--normalization", "LayerNorm", "--normalization LayerNorm does not match the checkpoint: {src} has "
                                     "rms_norm_eps (RMSNorm)"),
    ("--position-embedding-type", "learned_absolute", "--position-embedding-type learned_absolute does not match the "
                                                      "checkpoint: {src} has a rope_theta"),
    ("--untie-embeddings-and-output-weights", None, "--untie-embeddings-and-output-weights does not match the "
                                                    "checkpoint: {src} has tie_word_embeddings = true"),
    ("--add-qkv-bias", None, "--add-qkv-bias does not match the checkpoint: {src} has no q/k/v biases "
                             "(model_type 'llama', attention_bias False)"),
    ("--qk-layernorm", None, "--qk-layernorm does not match the checkpoint: {src} has model_type 'llama', which has no "
                             "query/key norm (those that do: qwen3, qwen3_moe, qwen3_next, olmo2, gemma3, gemma3_text)"),
])
def test_each_shape_mismatch_shows_both_values(base, tmp_path, flag, value, message):
    argv = base() + [flag] + ([value] if value is not None else [])
    assert problems(argv) == [message.format(src=tmp_path / "model" / "config.json")]


def test_shape_checks_read_older_and_other_config_layouts(base, tmp_path):
    src = tmp_path / "model" / "config.json"
    # rope_theta at the top level (transformers 4 layout), no head_dim (derived), GELU MLP, untied, biases
    argv = base(rope_parameters=None, rope_theta=500000.0, head_dim=None, hidden_act="gelu", tie_word_embeddings=False,
                mlp_bias=True)
    parse_config(argv + ["--rotary-base", "500000", "--kv-channels", "16", "--untie-embeddings-and-output-weights"])
    assert problems(argv + ["--swiglu", "--disable-bias-linear"]) == [
        f"--swiglu does not match the checkpoint: {src} has hidden_act = 'gelu' (SwiGLU needs silu)",
        f"--disable-bias-linear does not match the checkpoint: {src} has mlp_bias = true"]
    # Qwen2 always has q/k/v biases: --disable-bias-linear needs --add-qkv-bias with it
    qwen2 = base(model_type="qwen2", attention_bias=None, mlp_bias=None)
    (p,) = problems(qwen2 + ["--disable-bias-linear"])
    assert p.endswith("describes q/k/v biases (model_type 'qwen2', attention_bias None); add --add-qkv-bias")
    parse_config(qwen2 + ["--disable-bias-linear", "--add-qkv-bias"])
    parse_config(base(model_type="qwen3") + ["--qk-layernorm"])


def test_shape_flag_without_a_config_key_to_compare(base, tmp_path):
    (p,) = problems(base(max_position_embeddings=None) + ["--seq-length", "512"])
    assert p == f"--seq-length 512: {tmp_path / 'model' / 'config.json'} has no max_position_embeddings to check it against"


def test_shape_is_not_checked_when_the_directory_itself_is_bad(base, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    ps = problems(base(empty) + ["--num-layers", "99"])
    assert len(ps) == 3 and all("lacks" in p for p in ps)   # config, weights, tokenizer; no shape noise


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                  "--context-parallel-size", "--expert-model-parallel-size",
                                  "--expert-tensor-parallel-size"])
def test_parallel_sizes_above_one_are_refused(base, flag):
    assert problems(base() + [flag, "2"]) == [
        f"{flag} 2: not supported (slick's trainer is data-parallel only: FSDP2 ranks, --actor-num-gpus-per-node); "
        f"only 1 is accepted"]
    parse_config(base() + [flag, "1"])


def test_sequence_parallel_is_accepted_with_a_warning(base, caplog):
    with caplog.at_level(logging.WARNING, logger="slick.config"):
        cfg = parse_config(base() + ["--sequence-parallel"])
    assert cfg.sequence_parallel is True
    (rec,) = [r for r in caplog.records if r.name == "slick.config"]
    assert "--sequence-parallel has no effect with tensor-parallel size 1" in rec.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slick.config"):
        parse_config(base())
    assert not [r for r in caplog.records if r.name == "slick.config"]


@pytest.mark.parametrize("extra", [["--recompute-activations"], ["--recompute-granularity", "full"],
                                   ["--recompute-granularity", "selective"],
                                   ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-num-layers", "1"]])
def test_recompute_flags_turn_on_gradient_checkpointing(base, extra):
    assert parse_config(base()).gradient_checkpointing is False
    assert parse_config(base() + extra).gradient_checkpointing is True


@pytest.mark.parametrize("extra,message", [
    (["--recompute-granularity", "full", "--recompute-method", "block"], "--recompute-method block: not offered"),
    (["--recompute-granularity", "full", "--recompute-num-layers", "4"], "--recompute-num-layers 4: only 1 is offered"),
    (["--recompute-method", "uniform"], "--recompute-method / --recompute-num-layers need --recompute-granularity full"),
])
def test_recompute_layouts_slick_does_not_offer_are_refused(base, extra, message):
    (p,) = problems(base() + extra)
    assert p.startswith(message), p

"""Automatic choices (slick.config.auto): exact values for given inputs, a user flag always wins, the choices live in
the Plan and are logged once, and automatic micro-batching gives the same update as an explicit micro-batch size."""
import copy
import logging
import os
import random
import subprocess
import sys

import pytest
import torch

from slick.config import Config
from slick.configure import parse_config
from slick.cluster.engine_actor import engine_kwargs
from slick.config.auto import (FUSED_MODEL_TYPES, LEAN_DEFAULTS, GiB, Machine, ModelShape, Training,
                               activation_bytes_per_token, allocator_reason, engine_slots, lean_choice,
                               micro_batch_tokens, offload_choice, state_bytes, threads_reason)
from slick.config.config import ConfigError
from slick.configure.autoplan import offload_blockers
from slick.configure.plan import derive_plan
from slick.configure.validate import validate
from slick.loop.threads import thread_split
from slick.models.tiny import make_tiny_model
from slick.train.fused_layers import FUSED_LAYERS
from slick.train.trainer import DEFAULT_MICRO_BATCH_SIZE, Trainer
from slick.types import Sample
from tests.batches import batch_of

SMOLLM2 = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 576, "num_hidden_layers": 30,
           "vocab_size": 49152, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "tie_word_embeddings": True}
SHAPE = ModelShape.from_config(SMOLLM2)
RELEASED = Training(engine_released=True)   # bf16 autocast, fused layers, fp32 moments, engine freed in steps


def test_model_shape_and_memory_model_of_smollm2():
    assert SHAPE.params == 134_515_008                      # SmolLM2-135M, tied head counted once
    # per layer: the fp32 residual and the bf16 attention output after o_proj ((4 + 2) x 576) + qkv (2 x 960) +
    # attention out before o_proj (2 x 576) + lse (4 x 9) + gate/up (2 x 2 x 1536); outside the layers 3 x 4 x 576
    assert activation_bytes_per_token(SHAPE, Training()) == 30 * (3456 + 1920 + 1152 + 36 + 6144) + 6912 == 388_152
    assert activation_bytes_per_token(SHAPE, Training(recompute_mlp=True)) == 30 * (3456 + 1920 + 1152 + 36) + 6912
    # the HF layers: ~3x a fused layer that kept the residual twice (2 x 4 x 576)
    assert activation_bytes_per_token(SHAPE, Training(fused_layers=False)) == 30 * 3 * 13860 + 6912
    # fp32 AdamW: 16 bytes per parameter; the head's bf16 cast and three 128-row fp32 logits chunks; 1 GiB runtime
    head = 49152 * 576 * 2 + 3 * 128 * 49152 * 4
    assert state_bytes(SHAPE, RELEASED) == 16 * SHAPE.params + head + GiB
    assert state_bytes(SHAPE, Training(engine_released=True, exp_avg_bytes=2, exp_avg_sq_bytes=2)) == \
        12 * SHAPE.params + head + GiB
    kv = 30 * 2 * 3 * 64 * 2 * 1000
    assert state_bytes(SHAPE, Training(engine_tokens=1000)) == 16 * SHAPE.params + head + GiB + 2 * SHAPE.params + kv


@pytest.mark.parametrize("memory_gib, max_seq, tokens, why", [
    (32, None, 4096, "larger micro-batches are no faster"),          # the speed plateau
    (8, None, 4096, "larger micro-batches are no faster"),
    (6, None, 3584, "what the memory holds"),                         # 0.8 x 6 GiB - 3.13 GiB state, / 474 KiB
    (4, 176, 128, "memory is short"),                                 # the floor; longer samples go alone
    (2, None, 128, "memory is short"),                                # the state alone exceeds 80% of it
])
def test_micro_batch_budget_exact(memory_gib, max_seq, tokens, why):
    c = micro_batch_tokens(SHAPE, Machine(memory_gib * GiB, 2), RELEASED, max_seq, 48)
    assert c.value == tokens
    assert c.reason.startswith(f"auto: micro-batches of <= {tokens} tokens ({why}")
    assert f"model 135M, {memory_gib}.0 GiB available" in c.reason and c.reason.endswith(
        "--max-tokens-per-micro-batch or --micro-batch-size to override")
    assert (f"sequences <= {max_seq} tokens" if max_seq else "responses <= 48 tokens") in c.reason


def test_budget_follows_the_lean_flags_and_the_device():
    lean = Training(engine_released=True, recompute_mlp=True, exp_avg_bytes=2, exp_avg_sq_bytes=2)
    assert micro_batch_tokens(SHAPE, Machine(5 * GiB, 2), RELEASED, None, 48).value == 1920
    assert micro_batch_tokens(SHAPE, Machine(5 * GiB, 2), lean, None, 48).value == 4096
    assert micro_batch_tokens(SHAPE, Machine(5 * GiB, 2), Training(), None, 48).value == 512   # engine kept
    assert micro_batch_tokens(SHAPE, Machine(80 * GiB, 16, "cuda"), RELEASED, None, 48).value == 16384


FP32 = {"exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32", "recompute_mlp": False, "gradient_checkpointing": False}
BF16_MOMENTS = {**FP32, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}


@pytest.mark.parametrize("memory_gib, value, words", [
    (5, FP32, "auto: fp32 AdamW moments, MLP activations kept (memory suffices: 1930 tokens of activations fit "
              "beside the state); --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 or --recompute-mlp to lower the peak"),
    # 0.8 x 4.4 GiB - 3.13 GiB of state, / (388,152 x 1.25) leaves 868 tokens (< 1024: short); bf16 moments free
    # 4 x 135M bytes
    (4.4, BF16_MOMENTS, "auto: bf16 AdamW moments, since memory is short: 868 tokens of activations fit beside the "
                        "state, 1977 with them (bf16 AdamW moments: 4 bytes less per parameter, stochastic rounding); "
                        "--exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 to override"),
    # with both, 731 tokens are still short: whole layers are recomputed, keeping 30 x 4 x 576 bytes of layer
    # inputs, one layer's 6,564 and 6,912 outside per token (82,596 x 1.25): 1805 tokens
    (3.5, {**BF16_MOMENTS, "recompute_mlp": True, "gradient_checkpointing": True},
     "auto: bf16 AdamW moments, MLP recomputation and whole-layer recomputation, since memory is short: 0 tokens of "
     "activations fit beside the state, 1805 with them"),
])
def test_lean_settings_on_a_gpu_only_when_memory_is_short(memory_gib, value, words):
    c = lean_choice(SHAPE, Machine(int(memory_gib * GiB), 2, "cuda"), RELEASED, None, frozenset(LEAN_DEFAULTS))
    assert c.value == value and c.reason.startswith(words)


RECOMPUTE = {**FP32, "recompute_mlp": True}
CPU_LEAN = {**BF16_MOMENTS, "recompute_mlp": True}
CPU_MOMENT_WORDS = ("bf16 AdamW moments, the CPU default for bf16 training (4 bytes less per parameter, stochastic "
                    "rounding; --exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 to keep fp32)")
CPU_WORDS = ("MLP recomputation, the CPU default (the same numbers, ~45% less activation memory, ~3% more time; "
             "--no-recompute-mlp to keep the activations)")


@pytest.mark.parametrize("memory_gib, unset, value, words", [
    # recomputation frees 2 x 1536 x 2 bytes per layer and token (388,152 -> 203,832 bytes) and bf16 moments
    # 4 x 134,515,008 bytes of state: (0.8 x 5 GiB - 3.13 GiB + 0.54 GiB) / (203,832 x 1.25) = 5788 tokens
    (5, LEAN_DEFAULTS, CPU_LEAN,
     f"auto: memory suffices: 5788 tokens of activations fit beside the state; {CPU_MOMENT_WORDS}; {CPU_WORDS}"),
    (4.4, LEAN_DEFAULTS, CPU_LEAN,
     f"auto: memory suffices: 3765 tokens of activations fit beside the state; {CPU_MOMENT_WORDS}; {CPU_WORDS}"),
    # 731 tokens even with both: short, so whole layers are recomputed (1805 tokens, as on the GPU above)
    (3.5, LEAN_DEFAULTS, {**CPU_LEAN, "gradient_checkpointing": True},
     f"auto: whole-layer recomputation, since memory is short: 731 tokens of activations fit beside the state, 1805 "
     f"with them (whole-layer recomputation: only the layer inputs kept, one more forward (~1/3 more trainer FLOPs)); "
     f"--no-gradient-checkpointing to override; {CPU_MOMENT_WORDS}; {CPU_WORDS}"),
    # the same with --gradient-checkpointing given (off): nothing is left to take
    (3.5, set(LEAN_DEFAULTS) - {"gradient_checkpointing"}, {k: v for k, v in CPU_LEAN.items()
                                                             if k != "gradient_checkpointing"},
     f"auto: memory is short, and no lean setting left unset applies: 731 tokens of activations fit beside the "
     f"state; {CPU_MOMENT_WORDS}; {CPU_WORDS}"),
    # the moments given: the line says only what it chose
    (5, {"recompute_mlp"}, {"recompute_mlp": True},
     f"auto: memory suffices: 3677 tokens of activations fit beside the state; {CPU_WORDS}; --exp-avg-dtype bf16 "
     f"--exp-avg-sq-dtype bf16 to lower the peak"),
    # one moment given: the other keeps fp32, as on a GPU
    (5, {"exp_avg_sq_dtype", "recompute_mlp"}, {"exp_avg_sq_dtype": "fp32", "recompute_mlp": True},
     f"auto: fp32 AdamW moments (memory suffices: 3677 tokens of activations fit beside the state); {CPU_WORDS}; "
     f"--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 to lower the peak"),
])
def test_bf16_moments_and_mlp_recomputation_are_the_cpu_defaults(memory_gib, unset, value, words):
    c = lean_choice(SHAPE, Machine(int(memory_gib * GiB), 2), RELEASED, None, frozenset(unset))
    assert (c.value, c.reason) == (value, words)


def test_cpu_moments_stay_fp32_for_fp32_training_and_for_lora():
    fp32 = Training(engine_released=True, matmul_bytes=4)
    assert lean_choice(SHAPE, Machine(16 * GiB, 2), fp32, None, frozenset(LEAN_DEFAULTS)).value == RECOMPUTE
    lora = Training(engine_released=True, frozen_base=True)
    assert lean_choice(SHAPE, Machine(16 * GiB, 2), lora, None, frozenset(LEAN_DEFAULTS)).value == RECOMPUTE


@pytest.mark.parametrize("changes, fusable", [
    ({}, True), ({"model_type": "qwen3"}, True), ({"model_type": "mistral", "hidden_act": "swish"}, True),
    ({"model_type": "gpt2"}, False), ({"model_type": None}, False), ({"hidden_act": "gelu"}, False),
    ({"mlp_bias": True}, False),
])
def test_model_shape_knows_whether_the_fused_layers_cover_it(changes, fusable):
    assert ModelShape.from_config({**SMOLLM2, **changes}).fusable is fusable
    # the model types are those of the fused layer classes
    assert {f"{t}decoderlayer" for t in FUSED_MODEL_TYPES} == {name.lower() for name in FUSED_LAYERS}


def test_a_model_the_fused_layers_do_not_cover_keeps_its_mlp_activations_and_trains(tmp_path):
    model = make_tiny_model(tmp_path / "mb", mlp_bias=True)
    cfg = parse_config(["--hf-checkpoint", str(model)], validate=False)
    plan = derive_plan(cfg, "sync", [], Machine(32 * GiB, 2))
    assert plan.recompute_mlp is False and "recomputation" not in " ".join(c.reason for c in plan.auto)
    trainer = Trainer(plan.apply(cfg))
    assert trainer.fused_layers == 0


def test_no_cpu_recomputation_where_it_cannot_apply_or_is_given():
    unfused = Training(engine_released=True, fused_layers=False)
    assert lean_choice(SHAPE, Machine(16 * GiB, 2), unfused, None, frozenset(LEAN_DEFAULTS)).value == BF16_MOMENTS
    whole_layers = Training(engine_released=True, gradient_checkpointing=True)
    assert lean_choice(SHAPE, Machine(5 * GiB, 2), whole_layers, None, frozenset(LEAN_DEFAULTS)).value == \
        BF16_MOMENTS
    c = lean_choice(SHAPE, Machine(5 * GiB, 2), RELEASED, None, frozenset({"exp_avg_dtype", "exp_avg_sq_dtype"}))
    assert c.value == {"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"} and "recomputation" not in c.reason


def test_lean_choice_leaves_given_flags_and_what_cannot_apply():
    # --exp-avg-dtype/--exp-avg-sq-dtype given: only the MLP recomputation is chosen (160 -> 305 tokens at 4 GiB)
    c = lean_choice(SHAPE, Machine(4 * GiB, 2, "cuda"), RELEASED, None, frozenset({"recompute_mlp"}))
    assert c.value == {"recompute_mlp": True} and "160 tokens of activations fit beside the state, 305 with them" \
        in c.reason and c.reason.endswith("; --no-recompute-mlp to override")
    # without slick's fused layers (--disable-fused-layers, LoRA) there is no MLP to recompute: whole layers are
    unfused = Training(engine_released=True, fused_layers=False)
    assert lean_choice(SHAPE, Machine(3 * GiB, 2), unfused, None, frozenset(LEAN_DEFAULTS)).value == {
        **BF16_MOMENTS, "gradient_checkpointing": True}
    # a longer sample than fits is short too
    assert lean_choice(SHAPE, Machine(5 * GiB, 2, "cuda"), RELEASED, 2048, frozenset(LEAN_DEFAULTS)).value == BF16_MOMENTS


@pytest.mark.parametrize("memory_gib, bf16, slots, why", [
    (16, True, 256, "more gain little per byte of KV cache"),
    # beside: 0.8 x 8 GiB - (18 x 134,515,008 fp32 trainer and bf16 engine weights + 132,120,576 head + 1 GiB)
    # = 3,244,815,129.6 bytes; half of it / (23,040 KV bytes per token x 304 tokens) = 231.6
    (8, True, 231, "what 50% of the 3.0 GiB left beside the trainer's state and the engine's weights holds"),
    # fp32: 20 x params of weights, a 188,743,680-byte head, 46,080 KV bytes per token: 1,459,581,004.8 / 14,008,320
    (8, False, 104, "what 50% of the 2.7 GiB left beside"),
    (4, True, 1, "memory is short: the trainer's state and the engine's weights leave no room for more"),
])
def test_engine_slots_exact(memory_gib, bf16, slots, why):
    c = engine_slots(SHAPE, Machine(memory_gib * GiB, 2), Training(matmul_bytes=2 if bf16 else 4), 304)
    assert c.value == slots
    assert c.reason.startswith(f"auto: the engine decodes up to {slots} sequence{'s' * (slots > 1)} at once ({why}")
    assert c.reason.endswith(f"at 304 tokens each); --engine-max-running to override")
    # slick train-async: at most 64, still fewer when memory is short
    beside = engine_slots(SHAPE, Machine(memory_gib * GiB, 2), Training(matmul_bytes=2 if bf16 else 4), 304, True)
    assert beside.value == min(slots, 64)
    assert ("slow the trainer stepping beside the engine" in beside.reason) == (slots >= 64)


def test_engine_slots_in_the_plan_and_what_overrides_or_refuses_them(tiny_model_dir):
    base = {"hf_checkpoint": str(tiny_model_dir)}
    plan = _plan(base)
    assert plan.engine_max_running == 256 and any(c.value == 256 and "engine decodes" in c.reason for c in plan.auto)
    cfg, _ = validate(Config.from_flat(base), check_files=False)
    assert engine_kwargs(cfg)["max_running"] == 256                          # what the engine is built with
    assert _plan({**base, "max_staleness": 1}, driver="async").engine_max_running == 64
    for flags, slots in (({"engine_max_running": 32}, 32), ({"sglang": {"max_running_requests": "3"}}, 3)):
        plan = _plan({**base, **flags})
        assert plan.engine_max_running == slots and not any("engine decodes" in c.reason for c in plan.auto)
    # servers slick does not size: nothing chosen, and the flag is refused with what they take instead
    assert _plan({**base, "rollout_engine": "vllm"}).engine_max_running is None
    with pytest.raises(ConfigError, match="--engine-max-running sizes slick's own engine, but --rollout-engine vllm "
                                          "servers run their own: drop it .*--vllm-max-num-seqs N"):
        validate(Config.from_flat({**base, "rollout_engine": "vllm", "engine_max_running": 8}), check_files=False)
    with pytest.raises(ConfigError, match=r"--engine-max-running must be >= 1 \(got 0\)"):
        validate(Config.from_flat({**base, "engine_max_running": 0}), check_files=False)


def test_offload_choice_and_what_blocks_it():
    assert offload_choice([]).value is True
    assert "--no-offload-rollout" in offload_choice([]).reason
    cfg = Config.from_flat({})
    assert offload_blockers(cfg, "sync", 0) == []
    assert offload_blockers(cfg, "async", 0) == ["slick train-async generates while the trainer steps"]
    assert offload_blockers(Config.from_flat({"rollout_engine": "http"}), "sync", 0) == [
        "--rollout-engine http engines run in processes of their own"]
    assert offload_blockers(cfg, "sync", 2) == ["the engines are actors of their own"]
    assert offload_blockers(Config.from_flat({"debug_train_only": True}), "sync", 0) == [
        "--debug-train-only has no weight sync after a step"]
    no = offload_choice(["slick train-async generates while the trainer steps"])
    assert no.value is False and no.reason.endswith("(slick train-async generates while the trainer steps)")


def test_thread_split_and_its_line():
    cfg = Config.from_flat({})
    assert thread_split(cfg, overlap=False, device_is_cpu=True, cores=4) == (4, 4)
    assert thread_split(cfg, overlap=True, device_is_cpu=True, cores=4) == (2, 2)
    assert thread_split(cfg, overlap=True, device_is_cpu=True, cores=3) == (2, 1)
    assert thread_split(Config.from_flat({"train_num_threads": 1}), overlap=True, device_is_cpu=True, cores=4) == (1, 3)
    assert threads_reason(4, 4, 4, False, False).startswith("auto: CPU threads: all 4 for rollout and for training")
    assert threads_reason(4, 2, 2, True, False).startswith("auto: CPU threads: training 2 of 4 while the engine")
    assert threads_reason(4, 1, 3, True, True) == \
        "CPU threads: training 1, rollout 3 (--train-num-threads / --rollout-num-threads)"


def test_allocator_line_says_plainly_when_tcmalloc_cannot_be_had():
    assert allocator_reason(True, True, "auto") == (logging.INFO, "CPU allocator: tcmalloc")
    assert allocator_reason(False, True, "glibc", tuned=True) == (
        logging.INFO, "CPU allocator: glibc, tuned (SLICK_ALLOCATOR=glibc)")
    level, line = allocator_reason(False, False, "auto")
    assert level == logging.WARNING and "tcmalloc is not installed" in line and "make tcmalloc" in line
    level, line = allocator_reason(False, True, "auto")
    assert level == logging.WARNING and "installed but not preloaded" in line


def test_onednn_cache_line_and_the_entry_points_default(monkeypatch):
    from slick.config.auto import onednn_cache_reason
    from slick.proc.children import ONEDNN_CACHE_ENTRIES, ONEDNN_CACHE_ENV, ONEDNN_CACHE_MARK, foreign_engine_env
    from slick.proc.memory import limit_onednn_cache
    assert ONEDNN_CACHE_ENTRIES == 128 and ONEDNN_CACHE_ENV == "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
    assert onednn_cache_reason("128", 128) == (
        "auto: oneDNN primitive cache: 128 entries instead of 1024 (a micro-batch's shapes are new almost every "
        "step; their cached kernels are never reused); ONEDNN_PRIMITIVE_CACHE_CAPACITY to override")
    assert onednn_cache_reason("16", 128) == "oneDNN primitive cache: 16 entries (ONEDNN_PRIMITIVE_CACHE_CAPACITY)"
    assert onednn_cache_reason(None, 128).startswith("oneDNN primitive cache: 1024 entries (oneDNN's default")
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    monkeypatch.delenv(ONEDNN_CACHE_MARK, raising=False)
    assert limit_onednn_cache() == "128" and os.environ[ONEDNN_CACHE_ENV] == "128"
    # vLLM and SGLang servers keep oneDNN's default unless the user chose a value
    assert ONEDNN_CACHE_ENV not in foreign_engine_env(os.environ) and ONEDNN_CACHE_MARK not in foreign_engine_env(
        os.environ)
    assert foreign_engine_env({ONEDNN_CACHE_ENV: "16", ONEDNN_CACHE_MARK: "128"}) == {ONEDNN_CACHE_ENV: "16"}
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "16")   # the user's value wins
    monkeypatch.delenv(ONEDNN_CACHE_MARK)
    assert limit_onednn_cache() == "16" and os.environ[ONEDNN_CACHE_ENV] == "16"
    assert foreign_engine_env(os.environ)[ONEDNN_CACHE_ENV] == "16"


def test_the_slick_command_sets_the_onednn_cache_before_it_runs_a_command():
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    code = ("import os, sys\nfrom slick import cli\ntry:\n    cli.main(['inspect', '--help'])\n"
            "except SystemExit:\n    pass\nprint('CAP', os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "CAP 128"


# ------------------------------------------------------------------------------------------ the plan
def _plan(flags, machine=Machine(32 * GiB, 2), driver="sync"):
    problems = []
    plan = derive_plan(Config.from_flat(flags), driver, problems, machine)
    assert problems == []
    return plan


def test_the_plan_holds_the_choices_and_the_config_is_left_as_given(tiny_model_dir):
    cfg = Config.from_flat({"hf_checkpoint": str(tiny_model_dir)})
    before = copy.deepcopy(cfg.to_dict())
    plan = _plan({"hf_checkpoint": str(tiny_model_dir)})
    assert (plan.max_tokens_per_micro_batch, plan.offload_rollout) == (4096, True)
    from slick.train.precision import cpu_has_fast_bf16
    lean = CPU_LEAN if cpu_has_fast_bf16() else RECOMPUTE   # bf16 moments only where training runs in bf16
    assert [c.value for c in plan.auto] == [True, 256, lean, 4096]
    resolved = plan.apply(cfg)
    assert (resolved.max_tokens_per_micro_batch, resolved.offload_rollout, resolved.micro_batch_size) == (
        4096, True, None)
    assert cfg.to_dict() == before


@pytest.mark.parametrize("argv, tokens, mbs, offload", [
    (["--micro-batch-size", "4"], None, 4, True),
    (["--max-tokens-per-micro-batch", "512"], 512, None, True),
    (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "700"], 700, None, True),   # slime's spelling
    (["--no-offload-rollout"], 4096, None, False),
    (["--offload-rollout", "--micro-batch-size", "8"], None, 8, True),
])
def test_a_user_flag_always_wins(tiny_model_dir, tmp_path, argv, tokens, mbs, offload):
    cfg = parse_config(["--hf-checkpoint", str(tiny_model_dir)] + argv, validate=False)
    plan = derive_plan(cfg, "sync", [], Machine(32 * GiB, 2))
    resolved = plan.apply(cfg)
    assert (resolved.max_tokens_per_micro_batch, resolved.micro_batch_size, resolved.offload_rollout) == (
        tokens, mbs, offload)
    auto = [c.reason for c in plan.auto]
    assert sum("micro-batches" in r for r in auto) == (tokens == 4096)
    assert not any("in-process engine" in r for r in auto) if "offload" in " ".join(argv) else True


def test_no_model_shape_falls_back_to_a_sample_count():
    plan = _plan({"hf_checkpoint": "/nonexistent"})
    assert plan.max_tokens_per_micro_batch is None
    assert plan.auto[-1].reason.startswith(f"auto: micro-batches of {DEFAULT_MICRO_BATCH_SIZE} samples (no model shape")
    lean = [c for c in plan.auto if "AdamW" in c.reason or "MLP" in c.reason]
    assert [c.reason.split(" (")[0] for c in lean] == ["auto: fp32 AdamW moments, MLP activations kept"]
    # the line names only what it chose: --recompute-mlp given, the moments left to it
    plan = _plan({"hf_checkpoint": "/nonexistent", "recompute_mlp": True})
    lean = [c for c in plan.auto if "AdamW" in c.reason or "MLP" in c.reason]
    assert [c.reason.split(" (")[0] for c in lean] == ["auto: fp32 AdamW moments"]
    assert lean[0].value == {"exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32", "gradient_checkpointing": False}


def test_choices_are_logged_once_when_the_config_is_valid(tiny_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="slick"):
        validate(Config.from_flat({"hf_checkpoint": str(tiny_model_dir)}), check_files=False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("auto: ")]
    assert len(lines) == 4 and "freed while the trainer steps" in lines[0]
    assert lines[1].startswith("auto: the engine decodes up to ")
    from slick.train.precision import cpu_has_fast_bf16
    assert "memory suffices" in lines[2] and CPU_WORDS in lines[2]
    assert (CPU_MOMENT_WORDS in lines[2]) == cpu_has_fast_bf16()   # an AVX2-only CPU trains in fp32
    assert "micro-batches of <= " in lines[3]


def test_the_plan_takes_the_lean_settings_when_memory_is_short_and_a_flag_still_wins(tiny_model_dir):
    plan = _plan({"hf_checkpoint": str(tiny_model_dir)}, machine=Machine(0, 2))
    assert (plan.exp_avg_dtype, plan.exp_avg_sq_dtype, plan.recompute_mlp) == ("bf16", "bf16", True)
    cfg = parse_config(["--hf-checkpoint", str(tiny_model_dir), "--exp-avg-dtype", "fp32", "--no-recompute-mlp"],
                       validate=False)
    assert (cfg.exp_avg_dtype, cfg.exp_avg_sq_dtype, cfg.recompute_mlp) == ("fp32", None, False)
    resolved = derive_plan(cfg, "sync", [], Machine(0, 2)).apply(cfg)
    assert (resolved.exp_avg_dtype, resolved.exp_avg_sq_dtype, resolved.recompute_mlp) == ("fp32", "bf16", False)


# ------------------------------------------------------------------------------------------ same update
def _samples(n=12, seed=3):
    rng = random.Random(seed)
    out = []
    for g in range(n // 4):
        p = [rng.randrange(3, 1000) for _ in range(rng.randint(5, 12))]
        for _ in range(4):
            r = [rng.randrange(3, 1000) for _ in range(rng.randint(3, 20))]
            out.append(Sample(index=len(out), group_index=g, prompt_ids=p, response_ids=r))
    return out


def _loss(x):
    per = (x.advantages * x.logprobs * x.mask).sum(-1) / x.mask.sum(-1).clamp(min=1)
    return -per.sum() / x.num_samples, {}


def test_automatic_micro_batching_gives_the_same_update_as_an_explicit_size(tiny_model_dir):
    """One step of a tiny fp32 model: the plan's token budget (sized for no memory at all, so the batch is cut into
    several micro-batches of <= 128 tokens) and an explicit --micro-batch-size 5 accumulate the same gradient (to
    fp32 rounding) and take the same AdamW step: every weight whose gradient is not ~0 lands within 1% of the learning
    rate of the other run's (AdamW's first step divides a gradient by its own magnitude, so an entry whose gradient
    is ~0 moves by rounding, at most one step of the learning rate either way)."""
    samples = _samples()
    g = torch.Generator().manual_seed(0)
    adv = [torch.randn(len(s.response_ids), generator=g) for s in samples]
    lr = 1e-3
    # fp32 moments given: with no memory at all the plan would take bf16 ones (MLP recomputation: the same values)
    base = {"hf_checkpoint": str(tiny_model_dir), "dtype": "fp32", "device": "cpu", "lr": lr, "clip_grad": 0.0,
            "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"}
    grads, weights, plans = [], [], []
    for flags, machine in (({}, Machine(0, 2)), ({"micro_batch_size": 5}, None)):
        cfg = Config.from_flat({**base, **flags})
        tr = Trainer(derive_plan(cfg, "sync", [], machine).apply(cfg))
        plans.append(tr._plan(samples)[0])
        tr.forward_backward(batch_of(samples, adv), _loss)            # train_step = forward_backward + optimizer_step
        grads.append({n: p.grad.clone() for n, p in tr.model.named_parameters()})
        tr.optimizer_step()
        weights.append({n: p.detach().clone() for n, p in tr.model.named_parameters()})
    assert tr.cfg.max_tokens_per_micro_batch is None and plans[0] != plans[1] and len(plans[0]) > 1
    assert sorted(i for mb in plans[0] for i in mb) == list(range(len(samples)))
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7, msg=name)
        dw = (weights[0][name] - weights[1][name]).abs()
        sure = grads[0][name].abs() > 1e-6                   # AdamW moves these by ~lr in a definite direction
        assert float((dw * sure).max()) <= 0.01 * lr, name
        assert float(dw.max()) <= 2 * lr, name               # a ~0 gradient: one step of rounding at most
    start = Trainer(Config.from_flat(base)).model.state_dict()
    assert max(float((weights[0][n] - start[n]).abs().max()) for n in weights[0]) > 0.5 * lr   # the step moved them

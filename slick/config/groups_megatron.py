"""Megatron-LM's flags as a config group (``megatron``): what a slime script passes through to Megatron.

slick checks, maps or refuses each (``slick.config.megatron``); model-shape flags are checks against the
checkpoint's ``config.json``. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from slick.config.fields import F

PLANNED = "slick's trainer is data-parallel only: FSDP2 ranks, --actor-num-gpus-per-node"


def _parallel(kind: str):
    return F(1, f"Megatron {kind} size. Only 1 is accepted ({PLANNED}).")


def _shape(key: str, rule: str = "must equal", note: str = ""):
    return F(None, f"Megatron model shape: {rule} config.json's `{key}` ({note}checked when set).")


@dataclass
class MegatronCompatConfig:
    recompute_activations: bool = F(False, "Megatron: recompute activations in backward; turns on "
                                           "--gradient-checkpointing (slick recomputes whole layers).")
    recompute_granularity: Optional[str] = F(None, "Megatron: either value turns on --gradient-checkpointing (whole "
                                                   "layers are recomputed, also for `selective`).",
                                             choices=["full", "selective"])
    recompute_method: Optional[str] = F(None, "Megatron: `uniform` (slick recomputes every layer on its own); "
                                              "`block` is refused.", choices=["uniform", "block"])
    recompute_num_layers: Optional[int] = F(None, "Megatron: only 1 (every layer is its own recompute unit).")
    tensor_model_parallel_size: int = _parallel("tensor-parallel")
    pipeline_model_parallel_size: int = _parallel("pipeline-parallel")
    context_parallel_size: int = _parallel("context-parallel")
    expert_model_parallel_size: int = _parallel("expert-parallel")
    expert_tensor_parallel_size: int = _parallel("expert tensor-parallel")
    sequence_parallel: bool = F(False, "Megatron: splits activations over tensor-parallel ranks, so with tensor-parallel "
                                       "size 1 it does nothing: accepted with a warning, as Megatron does. To save "
                                       "memory use --recompute-activations, --micro-batch-size or "
                                       "--max-tokens-per-micro-batch.")
    num_layers: Optional[int] = _shape("num_hidden_layers")
    hidden_size: Optional[int] = _shape("hidden_size")
    ffn_hidden_size: Optional[int] = _shape("intermediate_size")
    num_attention_heads: Optional[int] = _shape("num_attention_heads")
    group_query_attention: bool = F(False, "Megatron: enables --num-query-groups; slick reads the attention layout "
                                           "from config.json, so this adds no check of its own.")
    num_query_groups: Optional[int] = _shape("num_key_value_heads")
    kv_channels: Optional[int] = _shape("head_dim", note="hidden_size / num_attention_heads without one; ")
    vocab_size: Optional[int] = _shape("vocab_size")
    seq_length: Optional[int] = _shape("max_position_embeddings", "must not exceed")
    max_position_embeddings: Optional[int] = _shape("max_position_embeddings", "must not exceed")
    rotary_base: Optional[float] = F(None, "Megatron model shape: must equal config.json's `rope_theta` (top level or "
                                           "in `rope_parameters`; checked when set).")
    norm_epsilon: Optional[float] = F(None, "Megatron model shape: must equal config.json's `rms_norm_eps` (or "
                                            "`layer_norm_eps`; checked when set).")
    normalization: Optional[str] = F(None, "Megatron model shape: RMSNorm needs `rms_norm_eps` in config.json, "
                                           "LayerNorm its absence (checked when set).", choices=["LayerNorm", "RMSNorm"])
    position_embedding_type: Optional[str] = F(None, "Megatron model shape: rope needs a rope_theta in config.json, "
                                                     "the others its absence (checked when set).",
                                               choices=["learned_absolute", "rope", "none"])
    use_rotary_position_embeddings: bool = F(False, "Megatron model shape: config.json must have a rope_theta.")
    swiglu: bool = F(False, "Megatron model shape: config.json's `hidden_act` must be silu (SwiGLU MLP).")
    untie_embeddings_and_output_weights: bool = F(False, "Megatron model shape: config.json's `tie_word_embeddings` "
                                                         "must be false.")
    disable_bias_linear: bool = F(False, "Megatron model shape: the checkpoint must have no MLP biases, and no "
                                         "q/k/v biases unless --add-qkv-bias is given.")
    add_qkv_bias: bool = F(False, "Megatron model shape: the checkpoint must have q/k/v biases (Qwen2, or "
                                  "`attention_bias: true`).")
    attention_dropout: Optional[float] = F(None, "Megatron: must equal config.json's `attention_dropout` (0 when "
                                                 "absent), the dropout slick trains with (checked when set).")
    hidden_dropout: Optional[float] = F(None, "Megatron: must equal config.json's `hidden_dropout` or `resid_pdrop` "
                                              "(0 when absent: Llama/Qwen-style models have none; checked when set).")
    qk_layernorm: bool = F(False, "Megatron model shape: the checkpoint must normalise queries and keys (Qwen3).")

"""Megatron-LM flags a slime user brings (the ``megatron`` group): map, refuse, or check them.

Recompute flags turn on gradient checkpointing (in the plan: ``slick.configure.plan``); parallel sizes other
than 1 are refused; model-shape flags are compared with the checkpoint's ``config.json``
(``shape_problems``), each mismatch showing both values. Standard library only.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

from slick.config.fields import flag_name
from slick.config.groups_megatron import PLANNED

log = logging.getLogger("slick.config")

PARALLEL_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size")
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_next", "olmo2", "gemma3", "gemma3_text")


def recompute_requested(cfg) -> bool:
    """Whether Megatron's full recompute is asked for (--recompute-activations or --recompute-granularity):
    the plan then turns on --gradient-checkpointing (``slick.configure.plan``)."""
    return bool(cfg.recompute_activations or cfg.recompute_granularity is not None)


def megatron_problems(cfg, problems: list[str]) -> None:
    """Refuse parallel sizes above 1 and recompute layouts slick does not offer (reads ``cfg`` only)."""
    for name in PARALLEL_SIZES:
        size = getattr(cfg, name)
        if size != 1:
            problems.append(f"{flag_name(name)} {size}: not supported ({PLANNED}); only 1 is accepted")
    if cfg.sequence_parallel and cfg.tensor_model_parallel_size == 1:
        log.warning("--sequence-parallel has no effect with tensor-parallel size 1 (Megatron disables it too); "
                    "to save memory use --recompute-activations, --micro-batch-size or --max-tokens-per-micro-batch")
    full = recompute_requested(cfg)
    if cfg.recompute_method == "block":
        problems.append("--recompute-method block: not offered (slick recomputes every layer on its own: "
                        "--recompute-method uniform --recompute-num-layers 1)")
    if cfg.recompute_num_layers is not None and cfg.recompute_num_layers != 1:
        problems.append(f"--recompute-num-layers {cfg.recompute_num_layers}: only 1 is offered (slick recomputes "
                        f"every layer on its own)")
    if (cfg.recompute_method or cfg.recompute_num_layers is not None) and not full:
        problems.append("--recompute-method / --recompute-num-layers need --recompute-granularity full "
                        "(or --recompute-activations)")


def _get(hf: dict, key: str) -> Any:
    """A key of config.json, or of its ``text_config`` (multimodal wrappers)."""
    if key in hf:
        return hf[key]
    text = hf.get("text_config")
    return text.get(key) if isinstance(text, dict) else None


def _rope_theta(hf: dict) -> Optional[float]:
    for d in (hf, hf.get("text_config") if isinstance(hf.get("text_config"), dict) else {}):
        if d.get("rope_theta") is not None:
            return d["rope_theta"]
        for nested in ("rope_parameters", "rope_scaling"):
            if isinstance(d.get(nested), dict) and d[nested].get("rope_theta") is not None:
                return d[nested]["rope_theta"]
    return None


def _head_dim(hf: dict) -> Optional[int]:
    if _get(hf, "head_dim") is not None:
        return _get(hf, "head_dim")
    hidden, heads = _get(hf, "hidden_size"), _get(hf, "num_attention_heads")
    return hidden // heads if hidden and heads else None


def _norm_eps(hf: dict) -> Optional[float]:
    for key in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"):
        if _get(hf, key) is not None:
            return _get(hf, key)
    return None


def _qkv_bias(hf: dict) -> bool:
    return bool(_get(hf, "attention_bias")) or hf.get("model_type") == "qwen2"


# field -> (what config.json calls it, how to read it, equal | at_most)
NUMBERS: dict[str, tuple[str, Callable[[dict], Any], str]] = {
    "num_layers": ("num_hidden_layers", lambda h: _get(h, "num_hidden_layers"), "equal"),
    "hidden_size": ("hidden_size", lambda h: _get(h, "hidden_size"), "equal"),
    "ffn_hidden_size": ("intermediate_size", lambda h: _get(h, "intermediate_size"), "equal"),
    "num_attention_heads": ("num_attention_heads", lambda h: _get(h, "num_attention_heads"), "equal"),
    "num_query_groups": ("num_key_value_heads",
                         lambda h: _get(h, "num_key_value_heads") or _get(h, "num_attention_heads"), "equal"),
    "kv_channels": ("head_dim", _head_dim, "equal"),
    "vocab_size": ("vocab_size", lambda h: _get(h, "vocab_size"), "equal"),
    "seq_length": ("max_position_embeddings", lambda h: _get(h, "max_position_embeddings"), "at_most"),
    "max_position_embeddings": ("max_position_embeddings", lambda h: _get(h, "max_position_embeddings"), "at_most"),
    "rotary_base": ("rope_theta", _rope_theta, "equal"),
    "norm_epsilon": ("rms_norm_eps", _norm_eps, "equal"),
    "attention_dropout": ("attention_dropout", lambda h: _get(h, "attention_dropout") or 0.0, "equal"),
    "hidden_dropout": ("hidden_dropout", lambda h: _get(h, "hidden_dropout") or _get(h, "resid_pdrop") or 0.0,
                       "equal"),
}


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=0.0)
    return a == b


def shape_problems(cfg, hf: dict, source: str) -> list[str]:
    """Every model-shape flag that disagrees with ``hf`` (the checkpoint's config.json, read from ``source``)."""
    p: list[str] = []
    for name, (key, read, rule) in NUMBERS.items():
        want = getattr(cfg, name)
        if want is None:
            continue
        have = read(hf)
        if have is None:
            p.append(f"{flag_name(name)} {want}: {source} has no {key} to check it against")
        elif rule == "equal" and not _same(want, have):
            p.append(f"{flag_name(name)} {want} does not match the checkpoint: {source} has {key} = {have}")
        elif rule == "at_most" and want > have:
            p.append(f"{flag_name(name)} {want} exceeds the checkpoint's {key} = {have} ({source})")
    rope = _rope_theta(hf) is not None
    rms = _get(hf, "rms_norm_eps") is not None
    act = _get(hf, "hidden_act")
    checks = [
        (cfg.normalization is not None and (cfg.normalization == "RMSNorm") != rms,
         f"--normalization {cfg.normalization} does not match the checkpoint: {source} "
         f"{'has' if rms else 'has no'} rms_norm_eps ({'RMSNorm' if rms else 'not RMSNorm'})"),
        (cfg.position_embedding_type is not None and (cfg.position_embedding_type == "rope") != rope,
         f"--position-embedding-type {cfg.position_embedding_type} does not match the checkpoint: {source} "
         f"{'has a' if rope else 'has no'} rope_theta"),
        (cfg.use_rotary_position_embeddings and not rope,
         f"--use-rotary-position-embeddings does not match the checkpoint: {source} has no rope_theta"),
        (cfg.swiglu and act not in ("silu", "swish"),
         f"--swiglu does not match the checkpoint: {source} has hidden_act = {act!r} (SwiGLU needs silu)"),
        (cfg.untie_embeddings_and_output_weights and bool(_get(hf, "tie_word_embeddings")),
         f"--untie-embeddings-and-output-weights does not match the checkpoint: {source} has "
         f"tie_word_embeddings = true"),
        (cfg.disable_bias_linear and bool(_get(hf, "mlp_bias")),
         f"--disable-bias-linear does not match the checkpoint: {source} has mlp_bias = true"),
        (cfg.disable_bias_linear and not cfg.add_qkv_bias and _qkv_bias(hf),
         f"--disable-bias-linear does not match the checkpoint: {source} describes q/k/v biases "
         f"(model_type {hf.get('model_type')!r}, attention_bias {_get(hf, 'attention_bias')!r}); add --add-qkv-bias"),
        (cfg.add_qkv_bias and not _qkv_bias(hf),
         f"--add-qkv-bias does not match the checkpoint: {source} has no q/k/v biases "
         f"(model_type {hf.get('model_type')!r}, attention_bias {_get(hf, 'attention_bias')!r})"),
        (cfg.qk_layernorm and hf.get("model_type") not in QK_NORM_MODEL_TYPES,
         f"--qk-layernorm does not match the checkpoint: {source} has model_type {hf.get('model_type')!r}, "
         f"which has no query/key norm (those that do: {', '.join(QK_NORM_MODEL_TYPES)})"),
    ]
    return p + [msg for bad, msg in checks if bad]

"""Hand-written Hugging Face model directories for config validation tests.

Validation reads only ``config.json`` and the names of the other files, so these directories hold a
real ``config.json`` (a 2-layer Llama like ``slick.models.tiny`` writes), a real one-tensor safetensors
file and a tokenizer file; nothing here is meant to be loaded as a model (use ``tiny_model_dir`` for that).
"""
import json
from pathlib import Path

LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "mlp_bias": False,
    "head_dim": 16, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
    "max_position_embeddings": 2048, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": True, "vocab_size": 49152,
}


def write_model_dir(path, config=None, weights=True, tokenizer=True, **overrides) -> Path:
    """Write a model directory at ``path``; ``config=False`` leaves config.json out, ``overrides`` change keys."""
    from safetensors.numpy import save_file
    import numpy as np

    d = Path(path)
    d.mkdir(parents=True, exist_ok=True)
    if config is not False:
        data = {**(config or LLAMA_CONFIG), **overrides}
        (d / "config.json").write_text(json.dumps(data), encoding="utf-8")
    if weights:
        save_file({"model.embed_tokens.weight": np.zeros((2, 2), dtype=np.float32)}, str(d / "model.safetensors"))
    if tokenizer:
        (d / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}')
        (d / "tokenizer_config.json").write_text("{}")
    return d

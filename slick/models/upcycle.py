"""Sparse upcycling: a dense llama-architecture model (SmolLM2-135M-Instruct) as a Mixtral mixture of experts.

No small pretrained MoE can be downloaded here, so the MoE to learn with is built from the dense model: every
decoder layer's MLP becomes ``experts`` copies of itself (Mixtral's SwiGLU experts: ``gate_proj``/``up_proj``
fused into ``gate_up_proj``, ``down_proj`` as is) behind a top-``top_k`` router; attention, norms, embeddings and
the LM head are copied unchanged. Mixtral renormalises the top-k gate weights to sum to 1, and the experts are
identical, so whatever the router chooses the upcycled model computes the dense model's function: its logits
start equal to the dense model's up to float rounding (``tests/test_moe_upcycle.py`` states the bound). The
router's weights are drawn from N(0, ``router_std``) with ``seed``: small, so the routing starts near uniform,
and distinct, so experts can specialise once training moves them apart.

:func:`prepare_smollm2_moe` builds the demo's MoE from SmolLM2 once and caches it beside the dense model.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from slick.models.smollm2 import DEFAULT_CACHE, prepare_smollm2, write_cached_dir

# the dense config fields a Mixtral config takes as they are
_SHARED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range",
           "rms_norm_eps", "rope_parameters", "rope_theta", "tie_word_embeddings", "bos_token_id", "eos_token_id",
           "pad_token_id", "attention_dropout")


def upcycle_to_mixtral(dense_dir, out_dir, experts: int = 4, top_k: int = 2, router_std: float = 0.02,
                       seed: int = 0) -> Path:
    """Write the Mixtral upcycling of the llama model in ``dense_dir`` (with its tokenizer) into ``out_dir``."""
    import torch
    import transformers

    if not 1 <= top_k <= experts <= 256:
        raise ValueError(f"upcycling needs 1 <= top_k <= experts <= 256 (got top_k={top_k}, experts={experts})")
    dense_cfg = json.loads((Path(dense_dir) / "config.json").read_text())
    if dense_cfg.get("model_type") not in ("llama", "mistral"):
        raise ValueError(f"{dense_dir}: upcycling takes a llama or mistral model (config.json model_type is "
                         f"{dense_cfg.get('model_type')!r})")
    dense = transformers.AutoModelForCausalLM.from_pretrained(str(dense_dir), dtype=torch.float32)
    kw = {k: v for k, v in dense.config.to_dict().items() if k in _SHARED and v is not None}
    config = transformers.MixtralConfig(**kw, num_local_experts=experts, num_experts_per_tok=top_k,
                                        router_jitter_noise=0.0, sliding_window=None)
    moe = transformers.MixtralForCausalLM(config).to(torch.float32)
    src = dense.state_dict()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in moe.named_parameters():
            if ".mlp.gate.weight" in name:     # the router
                p.copy_(torch.randn(p.shape, generator=gen) * router_std)
            elif name.endswith(".mlp.experts.gate_up_proj"):
                pre = name[: -len("experts.gate_up_proj")]
                gate_up = torch.cat([src[pre + "gate_proj.weight"], src[pre + "up_proj.weight"]], dim=0)
                p.copy_(gate_up.unsqueeze(0).expand_as(p))
            elif name.endswith(".mlp.experts.down_proj"):
                pre = name[: -len("experts.down_proj")]
                p.copy_(src[pre + "down_proj.weight"].unsqueeze(0).expand_as(p))
            elif name in src:
                p.copy_(src[name])
            else:
                raise KeyError(f"upcycling {dense_dir}: no dense weight for {name}")
    moe.tie_weights()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    moe.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(str(dense_dir)).save_pretrained(out)
    for extra in ("generation_config.json",):
        if (Path(dense_dir) / extra).is_file():
            shutil.copy2(Path(dense_dir) / extra, out / extra)
    return out


def prepare_smollm2_moe(experts: int = 4, top_k: int = 2, out_dir: str | os.PathLike | None = None) -> Path:
    """SmolLM2-135M-Instruct upcycled to ``experts`` experts, top-``top_k`` (cached; built once, atomically)."""
    out = Path(out_dir) if out_dir else DEFAULT_CACHE.parent / f"SmolLM2-135M-Instruct-MoE-{experts}x-top{top_k}"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    dense = prepare_smollm2()
    print(f"[slick] upcycling {dense.name} into {out} ({experts} experts, top-{top_k}; one-time)", flush=True)
    return write_cached_dir(out, lambda tmp: upcycle_to_mixtral(dense, tmp, experts, top_k))

"""The architecture a HF checkpoint's ``config.json`` describes, as far as the engine's forward pass needs it.

``ArchConfig.from_dir`` / ``from_dict`` read it and refuse, naming the field, what the engine does not run
(``SUPPORTED_ARCHS``, SiLU MLPs, default RoPE; MoE variants: ``slick.engine.moe``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slick.engine.moe import MOE_ARCHS, MoeSpec, parse_moe

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "mistral") + MOE_ARCHS


@dataclass
class ArchConfig:
    """The parts of a HF ``config.json`` the forward pass needs."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    qk_norm: bool
    window: Optional[int] = None       # sliding-window size if one applies (context is capped to it)
    moe: Optional[MoeSpec] = None      # the experts of a mixture-of-experts model (slick.engine.moe)

    @classmethod
    def from_dir(cls, path: str | Path) -> "ArchConfig":
        """Parse ``path/config.json``; raise ``ValueError`` naming the field for anything unsupported."""
        file = Path(path) / "config.json"
        if not file.is_file():
            raise FileNotFoundError(f"{file}: no config.json in model directory")
        try:
            c = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}:{e.lineno}: invalid JSON: {e.msg}") from e
        return cls.from_dict(c, source=str(file))

    @classmethod
    def from_dict(cls, c: dict, source: str = "config") -> "ArchConfig":
        mt = c.get("model_type")
        if mt not in SUPPORTED_ARCHS:
            raise ValueError(f"{source}: model_type={mt!r} is not supported by LocalEngine "
                             f"(supported: {', '.join(SUPPORTED_ARCHS)})")
        act = c.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")
        rope = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if scaling:
            rope_type = scaling.get("rope_type", scaling.get("type", rope_type))
        if rope_type not in (None, "default"):
            raise ValueError(f"{source}: rope scaling type {rope_type!r} is not supported "
                             "(field rope_parameters.rope_type / rope_scaling; only 'default')")
        theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
        heads = int(c["num_attention_heads"])
        hidden = int(c["hidden_size"])
        window = None
        sw = c.get("sliding_window")
        if sw and (mt in ("mistral", "mixtral") or c.get("use_sliding_window")):
            window = int(sw)
        layers = int(c["num_hidden_layers"])
        moe = parse_moe(c, mt, layers, source)
        return cls(
            model_type=mt, vocab_size=int(c["vocab_size"]), hidden_size=hidden,
            num_layers=layers, num_heads=heads,
            num_kv_heads=int(c.get("num_key_value_heads") or heads),
            head_dim=int(c.get("head_dim") or hidden // heads),
            intermediate_size=int(c["intermediate_size"]), rms_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta), max_position=int(c.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)), qk_norm=mt in ("qwen3", "qwen3_moe"),
            window=window, moe=moe)

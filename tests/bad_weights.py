"""Weight directories that a weight update must refuse as a whole (shared by engine and server tests).

Each starts with valid tensors of another model (so an update that copied as it went would change the
weights before failing) and then has one defect.
"""
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _valid(other_dir) -> dict:
    return load_file(str(Path(other_dir) / "model.safetensors"))


def wrong_shape_dir(other_dir, out) -> Path:
    """One file: every tensor valid but ``model.norm.weight`` (sorted after the embedding and layers)."""
    out = Path(out)
    out.mkdir(parents=True)
    sd = _valid(other_dir)
    sd["model.norm.weight"] = torch.ones(3)
    save_file(sd, str(out / "model.safetensors"))
    return out


def corrupt_shard_dir(other_dir, out) -> Path:
    """Two shards: the first valid (all but the final norm), the second truncated."""
    out = Path(out)
    out.mkdir(parents=True)
    sd = _valid(other_dir)
    norm = {"model.norm.weight": sd.pop("model.norm.weight")}
    save_file(sd, str(out / "model-00001-of-00002.safetensors"))
    second = out / "model-00002-of-00002.safetensors"
    save_file(norm, str(second))
    data = second.read_bytes()
    second.write_bytes(data[:-16])
    return out


def unknown_name_dir(other_dir, out) -> Path:
    """One file: every tensor valid plus ``model.layers.1.mlp.extra_proj.weight``."""
    out = Path(out)
    out.mkdir(parents=True)
    sd = _valid(other_dir)
    sd["model.layers.1.mlp.extra_proj.weight"] = torch.zeros(4, 4)
    save_file(sd, str(out / "model.safetensors"))
    return out


def int_dtype_dir(other_dir, out) -> Path:
    """One file: every tensor valid but ``model.norm.weight`` stored as int64."""
    out = Path(out)
    out.mkdir(parents=True)
    sd = _valid(other_dir)
    sd["model.norm.weight"] = torch.ones_like(sd["model.norm.weight"], dtype=torch.int64)
    save_file(sd, str(out / "model.safetensors"))
    return out


# (name, builder, words the error message must contain)
BAD_DIRS = [
    ("wrong shape", wrong_shape_dir, ["model.safetensors", "model.norm.weight", "shape [3]"]),
    ("corrupt second shard", corrupt_shard_dir, ["model-00002-of-00002.safetensors", "not a readable safetensors"]),
    ("unknown tensor name", unknown_name_dir, ["model.safetensors", "model.layers.1.mlp.extra_proj.weight",
                                               "not a weight of this model"]),
    ("integer dtype", int_dtype_dir, ["model.safetensors", "model.norm.weight", "I64"]),
]

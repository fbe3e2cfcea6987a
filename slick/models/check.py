"""Check a Hugging Face model directory on disk before anything loads it (standard library only).

slick never downloads a model: ``--hf-checkpoint`` (and ``--ref-load``) name local directories. Loading a
missing or incomplete directory through transformers gives a Hub "Repo id" traceback, a plea to install
sentencepiece, or a long network retry; these checks say plainly what is missing, in well under a second.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# files that hold a tokenizer's vocabulary (tokenizer_config.json alone does not)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _weight_problems(d: Path, where: str) -> list[str]:
    for index in WEIGHT_INDEXES:
        if (d / index).is_file():
            try:
                shards = set(json.loads((d / index).read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                return [f"{where}: {index} is not a valid weight index ({type(e).__name__}: {e})"]
            missing = sorted(s for s in shards if not (d / s).is_file())
            if missing:
                return [f"{where}: {index} lists weight files that are missing: {', '.join(missing)}"]
            return []
    if any(d.glob("*.safetensors")) or any(d.glob("pytorch_model*.bin")):
        return []
    return [f"{where}: lacks weights (*.safetensors or pytorch_model.bin)"]


def model_dir_problems(path: Optional[str], flag: str = "--hf-checkpoint", tokenizer: bool = True) -> list[str]:
    """Every problem with ``path`` as a local HF model directory, one message each (empty: fine).

    Checks that the directory exists, holds a readable ``config.json`` (a JSON object), weights
    (``*.safetensors`` or ``pytorch_model*.bin``; every shard named by an index file) and, when
    ``tokenizer`` is true, a tokenizer vocabulary file. Reads no weights and never touches the network."""
    where = f"{flag} {path}"
    d = Path(str(path)).expanduser()
    if not d.exists():
        hint = " (slick never downloads models: pass a local Hugging Face model directory)" if "/" in str(path) \
            and not str(path).startswith(("/", ".", "~")) else ""
        return [f"{where}: directory does not exist{hint}"]
    if not d.is_dir():
        return [f"{where}: is not a directory (pass a Hugging Face model directory)"]
    problems = []
    try:
        read_model_config(d)
    except FileNotFoundError:
        problems.append(f"{where}: lacks config.json")
    except ValueError as e:
        problems.append(f"{where}: {e}")
    problems += _weight_problems(d, where)
    if tokenizer and not any((d / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"{where}: lacks a tokenizer ({' or '.join(TOKENIZER_FILES)}; "
                        f"tokenizer_config.json alone is not enough)")
    return problems


def read_model_config(model_dir) -> dict:
    """``config.json`` of a model directory as a dict. FileNotFoundError when absent; ValueError naming the
    file (and line) when it is not a JSON object."""
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: top level must be a JSON object")
    return data

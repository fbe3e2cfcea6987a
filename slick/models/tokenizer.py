"""One tokenizer object per model directory and process: the run, the in-process engine, the trainer and the
critic share it instead of each loading its own (for SmolLM2: ~10 MiB and a fraction of a second each).

Tokenizers are only read after loading, so sharing is safe. The cache key includes the size and modification
time of the directory's tokenizer files: a directory rewritten in place loads afresh.
"""
from __future__ import annotations

import threading
from pathlib import Path

_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
          "tokenizer.model", "chat_template.jinja")
_CACHE: dict[tuple, object] = {}
_LOCK = threading.Lock()


def _key(path: Path) -> tuple:
    stats = []
    for name in _FILES:
        try:
            st = (path / name).stat()
        except OSError:
            continue
        stats.append((name, st.st_size, st.st_mtime_ns))
    return (str(path.resolve()), tuple(stats))


def load_tokenizer(path):
    """``AutoTokenizer.from_pretrained(path)`` for a local directory, loaded once per process."""
    from transformers import AutoTokenizer

    key = _key(Path(path))
    with _LOCK:
        tok = _CACHE.get(key)
        if tok is None:
            tok = _CACHE[key] = AutoTokenizer.from_pretrained(str(path))
    return tok

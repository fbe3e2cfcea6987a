"""Reading checkpoint ``.pt`` files without running code from them.

Every ``torch.load`` in slick goes through :func:`load_pt`, which uses ``weights_only=True``: the unpickler
restores tensors and plain data (dicts, lists, tuples, str, int, float, bool, None) and nothing else, so a
file whose pickle calls ``os.system``, ``open`` or any other global is refused before anything runs. slick
writes only such files (optimizer and scheduler states, RNG states as tensors, the loop state when it is not
JSON); a file that does not load this way was replaced or comes from elsewhere, and the error names it.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Iterable, Optional

import torch


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds Python objects beyond tensors and plain data; it was not loaded."""


def _detail(e: BaseException) -> str:
    text = str(e)
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"it calls or builds {found.group(1)}"
    for line in text.splitlines():
        if "Unsupported" in line or "unsupported" in line:
            return line.strip()
    return text.splitlines()[0].strip() if text else type(e).__name__


def load_pt(path, *, map_location=None, safe_globals: Optional[Iterable] = None):
    """``torch.load(path, weights_only=True)``; a file the safe unpickler refuses raises
    :class:`UnsafeCheckpointError` naming the file (nothing in it has run). ``safe_globals``: extra types or
    functions to accept for this one load (``torch.serialization.safe_globals``)."""
    path = Path(path)
    try:
        if safe_globals:
            with torch.serialization.safe_globals(list(safe_globals)):
                return torch.load(path, map_location=map_location, weights_only=True)
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpointError(
            f"{path}: refused to load: the file holds more than tensors and plain data ({_detail(e)}); loading "
            f"it would run code stored in the checkpoint. slick never writes such a file: it was replaced or "
            f"comes from elsewhere. Nothing from it was executed.") from None


def unsafe_globals(path) -> list[str]:
    """The globals a ``weights_only=True`` load of ``path`` would refuse (empty: the file loads safely)."""
    return list(torch.serialization.get_unsafe_globals_in_checkpoint(str(path)))

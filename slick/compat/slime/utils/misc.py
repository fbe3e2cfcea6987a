"""slime's ``load_function(path)``: the attribute a dotted path names (``"pkg.module.fn"``), for plug-ins that load
other plug-ins. A path that does not resolve raises ``ImportError`` / ``AttributeError`` naming it."""
from __future__ import annotations

import importlib
from typing import Any


def load_function(path: str) -> Any:
    module, _, name = path.rpartition(".")
    if not module:
        raise ImportError(f"load_function({path!r}): expected a dotted path like 'pkg.module.fn'")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:
        raise AttributeError(f"load_function({path!r}): module {module!r} has no attribute {name!r}") from None

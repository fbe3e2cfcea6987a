"""Load plug-ins given as dotted paths (``pkg.module.function``), as slime does."""
from __future__ import annotations

import importlib
from typing import Callable, Optional


def load_function(path: Optional[str], flag: str = "plugin") -> Optional[Callable]:
    """Import ``pkg.mod.fn`` and return ``fn``; None passes through. Errors name the flag and the path."""
    if not path:
        return None
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{flag}: '{path}' is not a dotted path like package.module.function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{flag}: cannot import module '{module_name}' ({e})") from e
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"{flag}: module '{module_name}' has no function '{attr}'")
    return fn

"""slime's ``load_function(path)``: the attribute a dotted path names (``"pkg.module.fn"``), for plug-ins that load
other plug-ins. slick's loader does the work (``slick.plugins.load_function``: also ``pkg.module:fn``, and an
error naming the path when it does not resolve)."""
from __future__ import annotations

from typing import Any

from slick.plugins import load_function as _load


def load_function(path: str) -> Any:
    return _load(path, "load_function")

"""Loading user reward functions given as dotted paths (``--custom-rm-path pkg.mod.fn``).

``pkg.mod:fn`` is accepted too. Errors name the path and what went wrong, and are raised when
the hub is built, not at the first reward call.
"""
from __future__ import annotations

import importlib
from typing import Callable


def load_function(path: str, flag: str = "--custom-rm-path") -> Callable:
    """Import ``pkg.mod.fn`` (or ``pkg.mod:fn``) and return the callable.

    Raises ``ValueError`` with the flag, the path and the reason (bad form, module not found,
    import error inside the module, missing attribute, not callable).
    """
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{flag}: expected a dotted path like 'pkg.module.fn', got {path!r}")
    path = path.strip()
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{flag} {path!r}: expected 'pkg.module.fn' (module and function name)")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise ValueError(f"{flag} {path!r}: module {module_name!r} not found "
                             f"(is it installed or on PYTHONPATH?)") from None
        raise ValueError(f"{flag} {path!r}: importing {module_name!r} failed: {e}") from e
    except Exception as e:  # noqa: BLE001 - user module raised while importing
        raise ValueError(f"{flag} {path!r}: importing {module_name!r} failed: "
                         f"{type(e).__name__}: {e}") from e
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"{flag} {path!r}: {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ValueError(f"{flag} {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn

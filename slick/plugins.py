"""Load plug-ins given as dotted paths, as slime does: the one loader behind every ``--*-path`` flag.

Two spellings are accepted:

- ``pkg.module.fn``: everything before the last dot is the module, the last part its attribute;
- ``pkg.module:obj.attr``: the module before ``:``, then an attribute path after it (nested
  attributes such as a class's static method are allowed only in this form).

Errors are ``ValueError`` naming the flag, the path and what went wrong, raised when the plug-in is
loaded (at start-up), not at its first call.
"""
from __future__ import annotations

import importlib
from typing import Callable, Optional

from slick.compat.finder import install as install_compat_names   # `import slime...` in plug-ins (docs/slime.md)


def _import(module_name: str, path: str, flag: str):
    install_compat_names()
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ValueError(f"{flag} {path!r}: module {module_name!r} not found "
                             f"(is it installed or on PYTHONPATH?)") from None
        raise ValueError(f"{flag} {path!r}: importing {module_name!r} failed: {e}") from e
    except Exception as e:  # noqa: BLE001 - the user's module raised while importing
        raise ValueError(f"{flag} {path!r}: importing {module_name!r} failed: "
                         f"{type(e).__name__}: {e}") from e


def load_function(path: Optional[str], flag: str = "plugin") -> Optional[Callable]:
    """Import ``pkg.mod.fn`` (or ``pkg.mod:fn``, ``pkg.mod:Obj.fn``) and return the callable.

    ``None`` or an empty string passes through as ``None`` (the plug-in is not set). Raises
    ``ValueError`` with the flag, the path and the reason: not a dotted path, module not found,
    import error inside the module, missing attribute, not callable.
    """
    if path is None or (isinstance(path, str) and not path.strip()):
        return None
    if not isinstance(path, str):
        raise ValueError(f"{flag}: expected a dotted path like 'pkg.module.fn', got {type(path).__name__} {path!r}")
    path = path.strip()
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr or any(not part for part in attr.split(".")):
        raise ValueError(f"{flag} {path!r}: not a dotted path like 'pkg.module.fn' or 'pkg.module:fn'")
    fn = _import(module_name, path, flag)
    owner = module_name
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ValueError(f"{flag} {path!r}: {owner!r} has no function {part!r}")
        fn = getattr(fn, part)
        owner = f"{owner}.{part}"
    if not callable(fn):
        raise ValueError(f"{flag} {path!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn

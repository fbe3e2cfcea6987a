"""``--sglang-*`` pass-through options as slick's own engine reads them.

``slick train`` collects ``--sglang-KEY VALUE`` into ``cfg.sglang`` (``{key: value}``, dashes turned into
underscores). The engines slick starts take the keys that have a meaning for them: ``slick serve`` accepts
``--sglang-KEY VALUE`` itself, and the in-process ``LocalEngine`` gets the same mapping. Every other key is
named in a warning and otherwise ignored.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    if isinstance(v, int):
        return v
    raise ValueError("expected an integer")


_DTYPES = {"auto": "auto", "bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "float": "fp32", "fp32": "fp32"}


def _dtype(v: Any) -> str:
    if not isinstance(v, str) or v not in _DTYPES:
        raise ValueError(f"choose one of {', '.join(sorted(_DTYPES))} (slick's engine has no float16)")
    return _DTYPES[v]


def _str(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError("expected a value")
    return v


# SGLang server argument -> (LocalEngine keyword argument, converter)
KNOWN: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "max_running_requests": ("max_running", _int),
    "context_length": ("max_seq_len", _int),
    "random_seed": ("seed", _int),
    "dtype": ("dtype", _dtype),
    "device": ("device", _str),
}


def flag(key: str) -> str:
    """``max_running_requests`` -> ``--sglang-max-running-requests``."""
    return "--sglang-" + key.replace("_", "-")


def engine_options(sglang: dict) -> tuple[dict, list[str]]:
    """Map ``{sglang key: value}`` to LocalEngine keyword arguments; return (kwargs, unknown keys).

    Raises ValueError naming the flag when a known key has a value that does not fit.
    """
    kwargs, unknown = {}, []
    for key, value in (sglang or {}).items():
        key = str(key).replace("-", "_")
        if key not in KNOWN:
            unknown.append(key)
            continue
        name, convert = KNOWN[key]
        try:
            kwargs[name] = convert(value)
        except ValueError as e:
            raise ValueError(f"{flag(key)} {value!r}: {e}") from None
    return kwargs, unknown


def unknown_warning(unknown: list[str], who: str) -> str:
    """The warning line for keys ``who`` has no use for."""
    names = ", ".join(flag(k) for k in unknown)
    return (f"{who}: ignoring {names}: no meaning for slick's engine (it honours "
            f"{', '.join(flag(k) for k in KNOWN)})")


def to_argv(sglang: dict) -> list[str]:
    """``{key: value}`` back to ``--sglang-KEY=VALUE`` arguments (a bare flag for ``True``)."""
    return [flag(str(k)) if v is True else f"{flag(str(k))}={v}" for k, v in (sglang or {}).items()]


def split_sglang_args(argv: Sequence[str], prefix: str = "--sglang-") -> tuple[list[str], dict]:
    """Remove ``--sglang-KEY [VALUE]`` / ``--sglang-KEY=VALUE`` (or another ``prefix``) from argv; return
    (rest, {key: value})."""
    rest, sg = [], {}
    argv = list(argv)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith(prefix):
            key, eq, val = a[len(prefix):].partition("=")
            key = key.replace("-", "_")
            if eq:
                sg[key] = val
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                sg[key] = argv[i + 1]
                i += 1
            else:
                sg[key] = True
        else:
            rest.append(a)
        i += 1
    return rest, sg

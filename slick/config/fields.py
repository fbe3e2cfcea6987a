"""Config fields: ``F`` makes one (default + help + metadata); the rest say what a field's metadata says: its flag
name, allowed values and help text (``choices_from`` / ``names_from`` registries are read when asked). Shared by
the groups, the parser, the validation, megatron's checks and the docs. Standard library only."""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import field
from typing import Optional


def F(default, help: str, **meta):
    """A config field with its help text (and optional choices / nargs)."""
    meta["help"] = help
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def registry_names(spec: str) -> list[str]:
    """Names of the registry at ``"module:attribute"`` (a dict's keys, or what a function returns), in order.
    Imports the module, so only parsers, docs and validation call it (never ``import slick.config``)."""
    module, _, attr = spec.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    return [str(n) for n in (obj() if callable(obj) else obj)]


def field_choices(f: dataclasses.Field) -> Optional[list]:
    """The allowed values of a field: its ``choices``, or the names of its ``choices_from`` registry."""
    if "choices" in f.metadata:
        return list(f.metadata["choices"])
    if "choices_from" in f.metadata:
        return registry_names(f.metadata["choices_from"])
    return None


def field_help(f: dataclasses.Field) -> str:
    """The help text of a field, with ``{names}`` filled from its ``names_from`` / ``choices_from`` registry."""
    spec = f.metadata.get("names_from") or f.metadata.get("choices_from")
    text = f.metadata["help"]
    return text.format(names=", ".join(registry_names(spec))) if spec else text

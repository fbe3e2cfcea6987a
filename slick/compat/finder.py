"""``import slime...`` in a user's plug-in resolves to ``slick.compat.slime...``, only when slime is not installed.

:func:`install` puts one finder in ``sys.meta_path``. For the top-level name ``slime`` it first asks every other
finder (the normal search of ``sys.path`` included) and answers only when none finds it, so an installed slime
always wins and nothing that can be imported today changes; it answers for ``slime.X`` only when ``slime`` is its
stand-in. ``slime.X`` and ``slick.compat.slime.X`` are then the same module object (classes are shared:
``isinstance`` works under either name). slick's plug-in loader
(``slick.plugins.load_function``) installs it before it imports a plug-in; a program may call :func:`install`
itself. Standard library only.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

ALIASES = {"slime": "slick.compat.slime"}   # a top-level name -> the package that stands in for it


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)   # the stand-in module itself, not a copy

    def exec_module(self, module) -> None:
        pass                                           # already executed under its own name


class AliasFinder(importlib.abc.MetaPathFinder):
    """Answers for the names in :data:`ALIASES` (and their submodules) with the stand-in module."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in ALIASES:
            return None
        real = ALIASES[top] + name[len(top):]
        if name == top:
            if any(_other_finds(f, name) for f in sys.meta_path if f is not self):
                return None                            # the real package is installed: it wins
        elif getattr(sys.modules.get(top), "__name__", None) != ALIASES[top]:
            return None                                # the real package's own submodules
        try:
            found = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            return None
        if found is None:
            return None
        return importlib.util.spec_from_loader(name, _Alias(real),
                                               is_package=found.submodule_search_locations is not None)


def _other_finds(finder, name: str) -> bool:
    find = getattr(finder, "find_spec", None)
    try:
        return find is not None and find(name, None) is not None
    except (ImportError, ValueError):
        return False


def installed() -> bool:
    return any(isinstance(f, AliasFinder) for f in sys.meta_path)


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once)."""
    if not installed():
        sys.meta_path.insert(0, AliasFinder())

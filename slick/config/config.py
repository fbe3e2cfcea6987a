"""The ``Config`` object: one instance per config group, plus flat attribute access; ``ConfigView``: the groups
one component is given.

A component that is not a plug-in host declares the groups it reads (``CONFIG_GROUPS``) and keeps
``cfg.view(*CONFIG_GROUPS)``: reading a field of another group raises :class:`ConfigScopeError` naming the field's
group, so what a component depends on is what its declaration says. The components that hand slime's plug-ins
``args`` (the rollout manager, the reward hub, the loss and advantage plug-ins) keep the whole ``Config``."""
from __future__ import annotations

import dataclasses
from typing import Any

from slick.config.groups import GROUPS


class ConfigError(ValueError):
    """Raised with every problem found, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


_FIELD_GROUP = {f.name: g for g, cls in GROUPS.items() for f in dataclasses.fields(cls)}


class Config:
    """Holds one dataclass per group. ``cfg.lr`` is ``cfg.train.lr``; setting works the same way."""

    def __init__(self, **groups: Any):
        for name, cls in GROUPS.items():
            object.__setattr__(self, name, groups.get(name) or cls())

    @classmethod
    def from_flat(cls, values: dict) -> "Config":
        """Build from a flat {field: value} dict; unknown keys raise ConfigError."""
        unknown = [k for k in values if k not in _FIELD_GROUP]
        if unknown:
            raise ConfigError([f"unknown config key '{k}'" for k in unknown])
        per_group: dict[str, dict] = {g: {} for g in GROUPS}
        for k, v in values.items():
            per_group[_FIELD_GROUP[k]][k] = v
        return cls(**{g: GROUPS[g](**kw) for g, kw in per_group.items()})

    def __getattr__(self, name: str) -> Any:
        group = _FIELD_GROUP.get(name)
        if group is None:
            raise AttributeError(f"Config has no field '{name}'")
        return getattr(object.__getattribute__(self, group), name)

    def __setattr__(self, name: str, value: Any) -> None:
        group = _FIELD_GROUP.get(name)
        if group is None:
            raise AttributeError(f"Config has no field '{name}'")
        setattr(getattr(self, group), name, value)

    def view(self, *groups: str) -> "ConfigView":
        """A read-only view of ``groups`` (names from ``slick.config.groups.GROUPS``)."""
        unknown = [g for g in groups if g not in GROUPS]
        if unknown:
            raise ValueError(f"no config group {', '.join(map(repr, unknown))} (groups: {', '.join(GROUPS)})")
        return ConfigView({g: getattr(self, g) for g in groups})

    def to_dict(self) -> dict:
        """Nested {group: {field: value}} (YAML-friendly)."""
        return {g: dataclasses.asdict(getattr(self, g)) for g in GROUPS}

    def flat(self) -> dict:
        return {k: v for grp in self.to_dict().values() for k, v in grp.items()}

    def __repr__(self) -> str:
        return f"Config({self.to_dict()!r})"


class ConfigScopeError(RuntimeError):
    """A component read a field of a config group it was not given (not an AttributeError: ``getattr`` with a
    default must not hide it)."""


class ConfigView:
    """Some groups of a ``Config``: ``view.lr`` is ``view.train.lr`` when ``train`` is one of them. Read-only;
    the group objects are the config's own (one source of truth). Pickles (Ray ranks receive views)."""

    __slots__ = ("_groups",)

    def __init__(self, groups: dict):
        object.__setattr__(self, "_groups", dict(groups))

    @property
    def groups(self) -> tuple:
        return tuple(self._groups)

    def view(self, *groups: str) -> "ConfigView":
        """A narrower view: ``groups`` must all be in this one."""
        missing = [g for g in groups if g not in self._groups]
        if missing:
            raise ConfigScopeError(f"config group(s) {', '.join(missing)} asked of a view of "
                                   f"{', '.join(self._groups) or 'no groups'}")
        return ConfigView({g: self._groups[g] for g in groups})

    def __getattr__(self, name: str) -> Any:
        groups = object.__getattribute__(self, "_groups")
        if name in groups:
            return groups[name]
        group = _FIELD_GROUP.get(name)
        if group in groups:
            return getattr(groups[group], name)
        if group is None and name not in GROUPS:
            raise AttributeError(f"Config has no field '{name}'")
        raise ConfigScopeError(f"'{name}' is in config group '{group or name}', which this component was not "
                               f"given (its groups: {', '.join(groups) or 'none'})")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a config view is read-only (setting '{name}')")

    def __reduce__(self):
        return ConfigView, (self._groups,)

    def to_dict(self) -> dict:
        return {g: dataclasses.asdict(v) for g, v in self._groups.items()}

    def __repr__(self) -> str:
        return f"ConfigView({self.to_dict()!r})"

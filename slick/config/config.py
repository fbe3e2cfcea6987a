"""The ``Config`` object: one instance per config group, plus flat attribute access."""
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

    def to_dict(self) -> dict:
        """Nested {group: {field: value}} (YAML-friendly)."""
        return {g: dataclasses.asdict(getattr(self, g)) for g in GROUPS}

    def flat(self) -> dict:
        return {k: v for grp in self.to_dict().values() for k, v in grp.items()}

    def __repr__(self) -> str:
        return f"Config({self.to_dict()!r})"

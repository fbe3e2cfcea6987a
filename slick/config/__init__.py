"""Typed configuration, importable from every room: the groups (``groups.py``), ``Config`` with flat and grouped
access and ``ConfigView`` (``config.py``), field metadata, slime's spellings and the flag tables.

Reading flags and YAML, checking a config against the rooms and deriving the run's plan live one room up, in
``slick.configure`` (``parse_config``, ``validate``): this package imports no other room.
"""
from slick.config.config import Config, ConfigError, ConfigScopeError, ConfigView

__all__ = ["Config", "ConfigError", "ConfigScopeError", "ConfigView"]

"""Typed configuration: groups in ``groups.py``, parser and loading in ``parse.py``,
checks in ``validate.py``. ``Config`` gives both ``cfg.train.lr`` and flat ``cfg.lr``."""
from slick.config.config import Config, ConfigError, ConfigScopeError, ConfigView
from slick.config.parse import build_parser, parse_config

__all__ = ["Config", "ConfigError", "ConfigScopeError", "ConfigView", "build_parser", "parse_config"]

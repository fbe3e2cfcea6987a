"""From flags and YAML to a checked ``Config`` and its ``Plan``: the generated argparse parser and YAML loading
(``parse.py``), validation against the rooms' registries (``validate.py``), the run's plan and automatic choices
(``plan.py``, ``autoplan.py``), LoRA flag checks (``lora.py``) and ``slick flags`` (``docs.py``).

The config types themselves are ``slick.config`` (below every domain room).
"""
from slick.configure.parse import build_parser, parse_config

__all__ = ["build_parser", "parse_config"]

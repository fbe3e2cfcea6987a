"""Build the argparse parser from the typed groups; load YAML; collect ``--sglang-*`` flags."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import typing
from pathlib import Path
from typing import Optional, Sequence

from slick.config.config import Config, ConfigError
from slick.config.fields import field_choices, field_help, flag_name, registry_names  # noqa: F401 - also names here
from slick.config.groups import GROUPS
from slick.config.sft_distill import sft_defaults
from slick.config.slime import add_slime_arguments, resolve_slime_flags
from slick.configure.validate import validate_config
from slick.serve.sglang_args import split_sglang_args


def _base_type(tp):
    if isinstance(tp, str):
        tp = eval(tp, vars(typing))  # annotations are strings under `from __future__ import annotations`
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) is typing.Union and args else tp


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one argument per config field, grouped as in ``groups.py``. Defaults are SUPPRESSed
    so that we can tell what the user typed (flags override --config YAML, which overrides defaults)."""
    parser.add_argument("--config", default=None, help="YAML file of config values (flat or grouped); flags override it.")
    for gname, cls in GROUPS.items():
        grp = parser.add_argument_group(gname)
        for f in dataclasses.fields(cls):
            meta = dict(f.metadata)
            if "flag" in meta and meta["flag"] is None:
                continue
            tp = _base_type(f.type)
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            help_ = f"{field_help(f)} (default: {default!r})".replace("%", "%%")
            kw = dict(dest=f.name, default=argparse.SUPPRESS, help=help_)
            if tp is bool:   # an unset (None) default: --flag / --no-flag, None meaning automatic
                action = argparse.BooleanOptionalAction if default is None else "store_true"
                grp.add_argument(flag_name(f.name), action=action, **kw)
                continue
            if tp is list or meta.get("nargs"):
                kw["nargs"] = meta.get("nargs", "+")
                kw["type"] = meta.get("type", str)
                if meta.get("repeat"):       # the flag may be given again: its values add up (slime's append)
                    kw["action"] = "extend"
            else:
                kw["type"] = tp
            choices = field_choices(f)
            if choices is not None:
                kw["choices"] = choices
            grp.add_argument(flag_name(f.name), **kw)
    add_slime_arguments(parser)


def build_parser(prog: str = "slick train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="RL post-training (slime-compatible flags).")
    add_config_arguments(parser)
    return parser


def load_yaml(path: str) -> dict:
    import yaml

    p = Path(path)
    if not p.exists():
        raise ConfigError([f"--config: file not found: {path}"])
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError([f"{path}: invalid YAML: {e}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level must be a mapping of config keys"])
    flat = {}
    for k, v in data.items():
        k = str(k).replace("-", "_")
        if k in GROUPS and isinstance(v, dict):
            flat.update({str(kk).replace("-", "_"): vv for kk, vv in v.items()})
        else:
            flat[k] = v
    return _coerce_yaml(flat, path)


def _coerce_yaml(flat: dict, path: str) -> dict:
    """Check YAML keys and convert values to the field types (YAML 1.1 reads ``1e-6`` as a string)."""
    fields = {f.name: f for cls in GROUPS.values() for f in dataclasses.fields(cls)}
    problems, out = [], {}
    for k, v in flat.items():
        f = fields.get(k)
        if f is None:
            problems.append(f"{path}: unknown config key '{k}'")
            continue
        tp = _base_type(f.type)
        try:
            if v is None or tp is typing.Any:
                pass
            elif tp is bool:
                if not isinstance(v, bool):
                    raise ValueError
            elif tp in (int, float):
                if isinstance(v, bool) or (tp is int and isinstance(v, float) and not v.is_integer()):
                    raise ValueError
                v = tp(v)
            elif tp is list:
                v = list(v) if isinstance(v, (list, tuple)) else [v]
                if "type" in f.metadata:
                    v = [f.metadata["type"](x) for x in v]
            elif tp is dict:
                if not isinstance(v, dict):
                    raise ValueError
            elif tp is str and not isinstance(v, str):
                v = str(v)
        except (TypeError, ValueError):
            problems.append(f"{path}: key '{k}' expects {getattr(tp, '__name__', tp)}, got {v!r}")
            continue
        out[k] = v
    if problems:
        raise ConfigError(problems)
    return out


def parse_config(argv: Optional[Sequence[str]] = None, parser: Optional[argparse.ArgumentParser] = None,
                 validate: bool = True, driver: str = "sync", defaults: Optional[dict] = None) -> Config:
    """Parse flags (and --config YAML) into a validated ``Config`` for ``driver`` ("sync" for slick train,
    "async" for slick train-async). ``defaults``: a command's own defaults (slick sft's), below the YAML and the
    flags. Raises ConfigError."""
    argv = sys.argv[1:] if argv is None else list(argv)
    rest, sglang = split_sglang_args(argv)
    rest, vllm = split_sglang_args(rest, "--vllm-")
    parser = parser or build_parser()
    ns = vars(parser.parse_args(rest))
    slime_problems = resolve_slime_flags(ns, driver)   # slime's spellings onto slick's fields, or refused by name
    if slime_problems:
        raise ConfigError(slime_problems)
    values = dict(defaults or {})
    values.update(load_yaml(ns.pop("config")) if ns.get("config") else {})
    ns.pop("config", None)
    values.update(ns)
    sft_defaults(values)
    if sglang:
        values["sglang"] = {**values.get("sglang", {}), **sglang}
    if vllm:
        values["vllm"] = {**values.get("vllm", {}), **vllm}
    cfg = Config.from_flat(values)
    if validate:
        cfg = validate_config(cfg, driver=driver)   # a new Config with the plan's derived values
    return cfg

"""The LoRA adapter a run asks for (``--lora-*``), read without torch: ``slick.config`` checks it before anything
loads; ``slick.train.lora`` builds it with PEFT."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slick.config import Config, ConfigView
from slick.models.adapter_check import ADAPTER_CONFIG, config_problems, read_config

ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraSpec:
    """The adapter a run trains: rank, alpha, dropout, target module names (or ``all-linear``), and an adapter
    directory to start from (``--lora-load``)."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple = (ALL_LINEAR,)
    load: Optional[str] = None

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_targets(self):
        return ALL_LINEAR if self.targets == (ALL_LINEAR,) else list(self.targets)


def parse_targets(text: Optional[str]) -> tuple:
    """``"q_proj,k_proj"`` -> ("q_proj", "k_proj"); None or empty -> ("all-linear",)."""
    names = tuple(t.strip() for t in (text or "").split(",") if t.strip())
    return names or (ALL_LINEAR,)


def read_adapter_config(path) -> dict:
    """``adapter_config.json`` of a PEFT adapter directory, checked (``slick.models.adapter_check``: LoRA, rank,
    finite alpha in range, no DoRA or per-layer patterns); FileNotFoundError / ValueError naming file and field."""
    conf = read_config(path)
    problems = config_problems(conf, str(Path(path) / ADAPTER_CONFIG))
    if problems:
        raise ValueError("; ".join(problems))
    return conf


def spec_from_config(cfg: Config | ConfigView) -> Optional[LoraSpec]:
    """The run's :class:`LoraSpec`, or None without ``--lora-rank`` and ``--lora-load``. With ``--lora-load``
    the adapter's own rank, alpha and targets are used (``slick.configure.lora`` refuses flags that differ)."""
    if not cfg.lora_rank and not cfg.lora_load:
        return None
    dropout = float(cfg.lora_dropout or 0.0)
    if cfg.lora_load:
        conf = read_adapter_config(cfg.lora_load)
        targets = conf.get("target_modules") or ALL_LINEAR
        targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
        return LoraSpec(int(conf["r"]), float(conf.get("lora_alpha") or conf["r"]), dropout, targets, cfg.lora_load)
    rank = int(cfg.lora_rank)
    alpha = float(cfg.lora_alpha) if cfg.lora_alpha is not None else 2.0 * rank
    return LoraSpec(rank, alpha, dropout, parse_targets(cfg.lora_target_modules))

"""``AlgoParams``: the typed, frozen algorithm settings that estimators and losses read.

Built once from the config's algorithm group (``AlgoParams.from_config(cfg)``); the values and
their defaults come from ``slick.config.groups.AlgorithmConfig`` only, so nothing here has a
default of its own. The flags that the loop reads (``--normalize-advantages``, the custom function
paths, ...) are not here: ``slick.algo`` sees only what its functions use.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class AlgoParams:
    """The algorithm flags read by ``slick.algo`` (``--flag-name`` = field name with dashes)."""

    advantage_estimator: str             # "gspo" selects the sequence-level ratio in the loss
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    kl_coef: float                       # KL penalty folded into token rewards (ppo, reinforce_plus_plus*)
    eps_clip: float
    eps_clip_high: Optional[float]
    eps_clip_c: Optional[float]
    entropy_coef: float
    disable_grpo_std_normalization: bool
    disable_rewards_normalization: bool
    calculate_per_token_loss: bool
    use_tis: bool
    tis_clip: float
    tis_clip_low: float
    tis_level: str                       # token | sequence | geometric (slick/algo/correction.py)
    use_mis: bool
    mis_level: str
    mis_low: float
    mis_high: float
    gamma: float
    lambd: float
    policy_loss: str                     # slick/algo/objectives.py (vanilla + advantage_estimator gspo = gspo)
    cispo_eps_low: Optional[float]
    cispo_eps_high: Optional[float]
    sapo_tau_pos: float
    sapo_tau_neg: float
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    use_opsm: bool                       # slick/algo/token_filters.py
    opsm_delta: float
    high_entropy_token_ratio: float

    @classmethod
    def from_config(cls, config: Any) -> "AlgoParams":
        """Take every field from ``config`` (a ``slick.config.Config``, its ``AlgorithmConfig`` group or an
        ``AlgoParams``); a missing field is an error naming it, never a default."""
        if isinstance(config, cls):
            return config
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if not hasattr(config, n)]
        if missing:
            raise ValueError(f"AlgoParams.from_config: {type(config).__name__} lacks the algorithm field(s) "
                             f"{', '.join(missing)}; pass a slick.config.Config (or its AlgorithmConfig group)")
        return cls(**{n: getattr(config, n) for n in names})

"""Start-up checks of the policy-loss flags (slick/algo/objectives.py, docs/algorithms.md, Policy losses).

Each flag does what it says or is refused by name: a hyperparameter of an objective the run does not train, a
combination its reference implementation does not define, a value out of range. Standard library only.
"""
from __future__ import annotations

from slick.config.fields import flag_name

# the objective -> the flags only it reads, with their defaults (a changed one without the objective is refused)
OWN_FLAGS = {
    "cispo": {"cispo_eps_low": None, "cispo_eps_high": None},
    "sapo": {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05},
    "clip_cov": {"clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0},
    "kl_cov": {"kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},
}
SEQUENCE_MEAN = ("sapo", "gmpo")   # verl and TRL reduce these per sequence whatever the loss aggregation
OUTCOME_ESTIMATORS = ("grpo", "gspo", "rloo", "reinforce_plus_plus_baseline")


def objective_name(cfg) -> str:
    """--policy-loss, where vanilla with --advantage-estimator gspo is gspo (slick.algo.objectives.loss_name)."""
    return "gspo" if cfg.policy_loss == "vanilla" and cfg.advantage_estimator == "gspo" else cfg.policy_loss


def objective_problems(cfg, p: list[str]) -> None:
    """Every problem of the policy-loss, OPSM, entropy-mask and DAPO flags, appended to ``p``."""
    name = objective_name(cfg)
    for owner, flags in OWN_FLAGS.items():
        for field, default in flags.items():
            if owner != name and getattr(cfg, field) != default:
                p.append(f"{flag_name(field)} configures --policy-loss {owner}, but the run trains {name}")
    _hyperparameter_problems(cfg, name, p)
    if name in SEQUENCE_MEAN and cfg.calculate_per_token_loss:
        p.append(f"--policy-loss {name} is defined with a per-sequence mean (verl, TRL); --calculate-per-token-loss "
                 f"is not defined for it: drop one of them")
    if name == "gmpo":
        token_level = [f for f, on in (("--advantage-estimator " + cfg.advantage_estimator,
                                        cfg.advantage_estimator not in OUTCOME_ESTIMATORS),
                                       (f"--kl-coef {cfg.kl_coef}", bool(cfg.kl_coef)), ("--use-opd", cfg.use_opd)) if on]
        if token_level:
            p.append(f"--policy-loss gmpo takes one advantage per sequence (verl's geo_mean); {', '.join(token_level)} "
                     f"gives per-token advantages")
        if cfg.use_mis:
            p.append("--policy-loss gmpo with --use-mis is not defined (verl weights GMPO's sequences by the geometric "
                     "mean of truncated IS weights: use --use-tis)")
    if cfg.eps_clip_c is not None and name not in ("vanilla", "gspo"):
        p.append(f"--eps-clip-c (dual clip) belongs to PPO's clipped loss; --policy-loss {name} has none")
    _filter_problems(cfg, p)


def _hyperparameter_problems(cfg, name: str, p: list[str]) -> None:
    for field in ("cispo_eps_low", "cispo_eps_high"):
        v = getattr(cfg, field)
        if v is not None and v < 0:
            p.append(f"{flag_name(field)} must be >= 0 (got {v})")
    for field in ("sapo_tau_pos", "sapo_tau_neg", "clip_cov_ratio", "kl_cov_ratio"):
        if getattr(cfg, field) <= 0:
            p.append(f"{flag_name(field)} must be > 0 (got {getattr(cfg, field)})")
    if cfg.clip_cov_lb >= cfg.clip_cov_ub:
        p.append(f"--clip-cov-lb {cfg.clip_cov_lb} must be below --clip-cov-ub {cfg.clip_cov_ub}")
    if cfg.ppo_kl_coef < 0:
        p.append(f"--ppo-kl-coef must be >= 0 (got {cfg.ppo_kl_coef})")


def _filter_problems(cfg, p: list[str]) -> None:
    """--use-opsm, --high-entropy-token-ratio, --overlong-buffer-len / --overlong-penalty-factor."""
    if not cfg.use_opsm and cfg.opsm_delta != 1e-4:
        p.append("--opsm-delta is the threshold of --use-opsm, which is off")
    if cfg.use_opsm and cfg.opsm_delta < 0:
        p.append(f"--opsm-delta must be >= 0 (got {cfg.opsm_delta})")
    if cfg.use_opsm and not cfg.use_rollout_logprobs and cfg.num_steps_per_rollout == 1:
        p.append("--use-opsm masks by the KL between the old policy and the current one, which are the same policy "
                 "with one optimizer step per rollout and no --use-rollout-logprobs (nothing would be masked): add "
                 "--use-rollout-logprobs (the engine's policy is the old one, as in slime) or take several "
                 "optimizer steps per rollout")
    if not 0.0 < cfg.high_entropy_token_ratio <= 1.0:
        p.append(f"--high-entropy-token-ratio must be in (0, 1] (got {cfg.high_entropy_token_ratio})")
    n = cfg.overlong_buffer_len
    if n is None:
        if cfg.overlong_penalty_factor != 1.0:
            p.append("--overlong-penalty-factor is the penalty of --overlong-buffer-len, which is unset")
        return
    if not 0 < n <= cfg.rollout_max_response_len:
        p.append(f"--overlong-buffer-len must be in 1..--rollout-max-response-len ({cfg.rollout_max_response_len}), "
                 f"got {n}")
    if cfg.overlong_penalty_factor < 0:
        p.append(f"--overlong-penalty-factor must be >= 0 (got {cfg.overlong_penalty_factor})")

"""Checks run before any model is loaded. Every problem is reported, one per line."""
from __future__ import annotations

from pathlib import Path

from slick.config.config import Config, ConfigError

ESTIMATORS = {"grpo", "gspo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo"}
RM_TYPES = {"math", "gsm8k", "exact", "f1", "countdown", "remote_rm"}


def _data_path(spec: str) -> str:
    """Strip a `@[start:end]` slice from a dataset spec."""
    return spec.split("@[", 1)[0]


def derive_batch_sizes(cfg: Config, problems: list[str]) -> None:
    samples = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    gbs, steps = cfg.global_batch_size, cfg.num_steps_per_rollout
    if gbs is None and steps is None:
        cfg.num_steps_per_rollout, cfg.global_batch_size = 1, samples
    elif gbs is None:
        if steps <= 0 or samples % steps:
            problems.append(f"--num-steps-per-rollout {steps} does not divide rollout_batch_size x "
                            f"n_samples_per_prompt = {samples}")
        else:
            cfg.global_batch_size = samples // steps
    elif steps is None:
        if gbs <= 0 or samples % gbs:
            problems.append(f"--global-batch-size {gbs} does not divide rollout_batch_size x "
                            f"n_samples_per_prompt = {samples}")
        else:
            cfg.num_steps_per_rollout = samples // gbs
    elif gbs * steps != samples:
        problems.append(
            f"batch sizes disagree: rollout_batch_size x n_samples_per_prompt = {cfg.rollout_batch_size} x "
            f"{cfg.n_samples_per_prompt} = {samples}, but global_batch_size x num_steps_per_rollout = "
            f"{gbs} x {steps} = {gbs * steps}")


def validate_config(cfg: Config, check_files: bool = True) -> Config:
    """Fill derived values and raise ConfigError listing every problem."""
    p: list[str] = []
    if cfg.rollout_batch_size <= 0:
        p.append("--rollout-batch-size must be positive")
    if cfg.n_samples_per_prompt <= 0:
        p.append("--n-samples-per-prompt must be positive")
    if not p:
        derive_batch_sizes(cfg, p)
    if cfg.kl_coef and cfg.kl_loss_coef:
        p.append("--kl-coef and --kl-loss-coef are both non-zero: use KL in the reward or as a loss, not both")
    if cfg.eps_clip_c is not None and cfg.eps_clip_c <= 1:
        p.append(f"--eps-clip-c must be > 1 (got {cfg.eps_clip_c})")
    if cfg.rollout_temperature <= 0:
        p.append(f"--rollout-temperature must be > 0 for RL rollouts (got {cfg.rollout_temperature})")
    if cfg.advantage_estimator not in ESTIMATORS:
        p.append(f"unknown --advantage-estimator '{cfg.advantage_estimator}' (choose from {sorted(ESTIMATORS)})")
    rm = cfg.rm_type
    if rm and not cfg.custom_rm_path:
        base = rm[len("boxed_"):] if rm.startswith("boxed_") else rm
        if base not in RM_TYPES:
            p.append(f"unknown --rm-type '{rm}' (choose from {sorted(RM_TYPES)}, optionally prefixed boxed_)")
        if base == "remote_rm" and not cfg.rm_url:
            p.append("--rm-type remote_rm needs --rm-url")
    if len(cfg.eval_prompt_data) % 2:
        p.append("--eval-prompt-data takes NAME PATH pairs")
    if cfg.over_sampling_batch_size is not None and cfg.over_sampling_batch_size <= 0:
        p.append("--over-sampling-batch-size must be positive")
    if cfg.rollout_engine == "http" and not cfg.rollout_urls and not cfg.hf_checkpoint:
        p.append("--rollout-engine http needs --rollout-urls or --hf-checkpoint (to launch workers)")
    if cfg.actor_num_nodes != 1 or cfg.actor_num_gpus_per_node > 1:
        p.append("--actor-num-nodes > 1 / --actor-num-gpus-per-node > 1: slick trains in one process for now "
                 "(scale rollout out with --rollout-engine http instead)")
    if cfg.update_weights_interval < 1:
        p.append("--update-weights-interval must be >= 1")
    elif cfg.num_steps_per_rollout and cfg.update_weights_interval > 1:
        # engines lag the trainer by up to (interval - 1) rollouts of optimizer steps: allow that staleness
        lag = (cfg.update_weights_interval - 1) * cfg.num_steps_per_rollout
        cfg.max_staleness = max(cfg.max_staleness, lag)
    if check_files:
        specs = [("--prompt-data", cfg.prompt_data)] if cfg.prompt_data else []
        specs += [("--eval-prompt-data", s) for s in cfg.eval_prompt_data[1::2]]
        if cfg.load_debug_rollout_data is None and not cfg.prompt_data:
            p.append("--prompt-data is required (or --load-debug-rollout-data)")
        for flag, spec in specs:
            if not Path(_data_path(spec)).is_file():
                p.append(f"{flag}: file not found: {_data_path(spec)}")
    if p:
        raise ConfigError(p)
    return cfg

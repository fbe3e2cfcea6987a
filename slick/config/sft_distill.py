"""Checks of the SFT and on-policy distillation flags (``SftDistillConfig``), run with every config check.

Every flag does what it says or the run is refused naming it (docs/sft.md, docs/distillation.md).
Standard library only.
"""
from __future__ import annotations

from pathlib import Path

# --rollout-function-path values that select the SFT rollout (slick's and slime's spelling)
SFT_ROLLOUT_PATHS = ("slick.rollout.sft.generate_rollout", "slime.rollout.sft_rollout.generate_rollout")
OPD_TYPES = {"trainer": "trainer", "megatron": "trainer", "engine": "engine", "sglang": "engine"}


# what --loss-type sft_loss implies unless a flag or the YAML says otherwise: one sample per chat (slime's default,
# which its SFT scripts rely on) and no engine memory to release
SFT_IMPLIED = {"n_samples_per_prompt": 1, "offload_rollout": False}


def sft_defaults(values: dict) -> None:
    """Fill ``values`` (flat config values: command defaults, YAML, flags) with :data:`SFT_IMPLIED` where the run
    is SFT and they are not set."""
    if values.get("loss_type") == "sft_loss":
        for key, value in SFT_IMPLIED.items():
            values.setdefault(key, value)


def is_sft(cfg) -> bool:
    return getattr(cfg, "loss_type", "policy_loss") == "sft_loss"


def sft_problems(cfg, driver: str, p: list[str]) -> None:
    """--loss-type sft_loss (and slime's SFT spellings): what SFT cannot be combined with."""
    path = cfg.rollout_function_path
    if not is_sft(cfg):
        if path in SFT_ROLLOUT_PATHS:
            p.append(f"--rollout-function-path {path} is the SFT rollout: it needs --loss-type sft_loss")
        if cfg.disable_compute_advantages_and_returns and cfg.loss_type == "policy_loss":
            p.append("--disable-compute-advantages-and-returns with --loss-type policy_loss: the policy loss's "
                     "gradient is the advantage, so nothing would train; use --loss-type sft_loss or custom_loss")
        return
    why = "--loss-type sft_loss"
    if path is not None and path not in SFT_ROLLOUT_PATHS:
        p.append(f"{why} reads chats with the SFT rollout; --rollout-function-path {path} would replace it "
                 f"(leave it unset or give {SFT_ROLLOUT_PATHS[0]})")
    if driver == "async":
        p.append(f"{why}: slick train-async overlaps generation and training, and SFT generates nothing: use "
                 "slick sft (or slick train)")
    if cfg.n_samples_per_prompt != 1:
        p.append(f"{why} trains each chat once per step: --n-samples-per-prompt must be 1 (got "
                 f"{cfg.n_samples_per_prompt})")
    if cfg.rollout_temperature != 1.0:
        p.append(f"{why} trains logprobs at temperature 1: --rollout-temperature {cfg.rollout_temperature} would "
                 "scale the logits")
    for flag, on in (("--custom-loss-function-path", cfg.custom_loss_function_path),
                     ("--use-kl-loss", cfg.use_kl_loss), ("--kl-coef", cfg.kl_coef), ("--use-tis", cfg.use_tis),
                     ("--use-opd", cfg.use_opd), ("--debug-rollout-only", cfg.debug_rollout_only),
                     ("--load-debug-rollout-data", cfg.load_debug_rollout_data),
                     ("--advantage-estimator ppo (a critic)", cfg.advantage_estimator == "ppo"),
                     ("--rollout-urls", cfg.rollout_urls), ("--agent-function-path", cfg.agent_function_path)):
        if on:
            p.append(f"{flag} does not apply to {why} (the loss is the assistant tokens' NLL, no engine runs)")


def lr_problems(cfg, p: list[str]) -> None:
    if cfg.lr_decay_style != "constant" and not cfg.lr_decay_iters:
        p.append(f"--lr-decay-style {cfg.lr_decay_style} needs --lr-decay-iters N (optimizer steps of the decay)")
    if cfg.lr_decay_iters is not None and cfg.lr_decay_iters <= cfg.lr_warmup_steps:
        p.append(f"--lr-decay-iters {cfg.lr_decay_iters} must be > --lr-warmup-steps {cfg.lr_warmup_steps}")
    if cfg.lr_decay_iters is not None and cfg.lr_decay_style == "constant":
        p.append(f"--lr-decay-iters {cfg.lr_decay_iters} with --lr-decay-style constant: choose linear or cosine")
    if not 0.0 <= cfg.min_lr <= cfg.lr:
        p.append(f"--min-lr {cfg.min_lr} must be between 0 and --lr {cfg.lr}")


SLIME_OPD_RM = "slime.rollout.on_policy_distillation."   # slime's teacher-as-reward-function spelling


def opd_problems(cfg, check_files: bool, p: list[str]) -> None:
    if (cfg.custom_rm_path or "").startswith(SLIME_OPD_RM):
        p.append(f"--custom-rm-path {cfg.custom_rm_path}: slime's teacher-as-reward function; in slick the teacher "
                 "scores through --use-opd --opd-type sglang --opd-teacher-url URL (the server slime gives "
                 "--rm-url, without /generate) and the reward stays a reward (docs/distillation.md)")
    if not cfg.use_opd:
        for flag, on in (("--opd-teacher-load", cfg.opd_teacher_load), ("--opd-teacher-url", cfg.opd_teacher_url),
                         ("--opd-only", cfg.opd_only)):
            if on:
                p.append(f"{flag} needs --use-opd")
        return
    engine = OPD_TYPES.get(cfg.opd_type) == "engine"
    if cfg.opd_teacher_url and not engine:
        p.append(f"--opd-teacher-url is a teacher server: it needs --opd-type engine (or sglang), not {cfg.opd_type}")
    if cfg.opd_teacher_url and not str(cfg.opd_teacher_url).startswith(("http://", "https://")):
        p.append(f"--opd-teacher-url {cfg.opd_teacher_url}: not an http:// or https:// URL")
    if not cfg.opd_teacher_load and not (engine and cfg.opd_teacher_url):
        p.append("--use-opd needs --opd-teacher-load TEACHER_DIR (a Hugging Face model directory)"
                 + (" or --opd-teacher-url URL" if engine else ""))
    elif cfg.opd_teacher_load and check_files and not Path(cfg.opd_teacher_load, "config.json").is_file():
        p.append(f"--opd-teacher-load {cfg.opd_teacher_load}: not a model directory (no config.json)")
    if cfg.opd_kl_coef < 0:
        p.append(f"--opd-kl-coef must be >= 0 (got {cfg.opd_kl_coef})")
    if cfg.opd_only and cfg.opd_kl_coef == 0:
        p.append("--opd-only with --opd-kl-coef 0: every advantage would be 0")
    if cfg.lora_rank or cfg.lora_load:
        p.append("--use-opd with LoRA: distillation is built and tested for full-weight trainers only")


def sft_distill_problems(cfg, driver: str, check_files: bool, p: list[str]) -> None:
    """Every problem of the SFT, OPD and LR-schedule flags of ``cfg``, appended to ``p``."""
    if cfg.loss_type == "custom_loss" and not cfg.custom_loss_function_path:
        p.append("--loss-type custom_loss needs --custom-loss-function-path")
    sft_problems(cfg, driver, p)
    lr_problems(cfg, p)
    opd_problems(cfg, check_files, p)

"""Checks of the LoRA flags (``--lora-*``), before anything loads: values, the combinations LoRA cannot run with,
and, with the model directory at hand, the target names and the rank against the model's linear layers (built
on the meta device from config.json: no weights are read). See docs/lora.md."""
from __future__ import annotations

from pathlib import Path

from slick.models.adapter_check import alpha_problem, rank_problem, weights_problems
from slick.train.lora_spec import parse_targets, read_adapter_config, spec_from_config


def _combination_problems(cfg, p: list[str]) -> None:
    """Flags LoRA cannot run with, and why."""
    if cfg.recompute_mlp:
        p.append("--recompute-mlp recomputes inside slick's fused decoder layers, which LoRA does not use (PEFT's "
                 "adapted layers run the HF forward); use --gradient-checkpointing")
    if cfg.train_precision == "bf16" and cfg.dtype != "fp32":
        p.append("--train-precision bf16 with LoRA: LoRA keeps the frozen base in bf16 and trains fp32 adapters "
                 "under autocast by itself; leave --train-precision at autocast")
    if cfg.ref_load:
        p.append("--ref-load with LoRA: the KL reference is the base model with the adapters disabled (no second "
                 "model); drop --ref-load")


def _load_problems(cfg, p: list[str]) -> None:
    """--lora-load: the adapter's own rank, alpha and targets; flags given beside it must agree."""
    try:   # the config's method, rank and alpha (slick.models.adapter_check)
        conf = read_adapter_config(cfg.lora_load)
    except (FileNotFoundError, ValueError) as e:
        p.append(f"--lora-load: {e}")
        return
    if cfg.lora_rank and cfg.lora_rank != conf["r"]:
        p.append(f"--lora-rank {cfg.lora_rank} but the --lora-load adapter has rank {conf['r']}")
    if cfg.lora_alpha is not None and float(cfg.lora_alpha) != float(conf.get("lora_alpha") or 0):
        p.append(f"--lora-alpha {cfg.lora_alpha:g} but the --lora-load adapter has alpha {conf.get('lora_alpha')}")
    if cfg.lora_target_modules is not None:
        theirs = conf.get("target_modules")
        theirs = (theirs,) if isinstance(theirs, str) else tuple(sorted(theirs or ()))
        if tuple(sorted(parse_targets(cfg.lora_target_modules))) != theirs:
            p.append(f"--lora-target-modules {cfg.lora_target_modules} but the --lora-load adapter targets "
                     f"{', '.join(theirs)}")
    p += [f"--lora-load: {m}" for m in weights_problems(cfg.lora_load, conf["r"])]   # names, shapes (headers)


def _model_problems(cfg, p: list[str]) -> None:
    """Target names and rank against --hf-checkpoint's linear layers (meta device: nothing loads)."""
    from slick.train.lora import meta_model, target_problems   # import cost: torch, only when LoRA is asked for

    if not cfg.hf_checkpoint or not (Path(cfg.hf_checkpoint) / "config.json").is_file():
        return   # the model directory's own check names what is missing
    try:
        spec = spec_from_config(cfg)
        model = meta_model(cfg.hf_checkpoint)
    except Exception as e:   # noqa: BLE001 - an unreadable config is reported, not raised
        p.append(f"--lora-rank: cannot build {cfg.hf_checkpoint}'s model to check the adapter targets "
                 f"({type(e).__name__}: {e})")
        return
    p += target_problems(model, spec, cfg.hf_checkpoint)
    if spec.load:   # the adapter's layers and shapes against the model's weights
        shapes = {n: tuple(t.shape) for n, t in model.named_parameters()}
        p += [f"--lora-load: {m}" for m in weights_problems(spec.load, spec.rank, shapes)]


def lora_problems(cfg, p: list[str], check_files: bool = True) -> None:
    """Every problem with the LoRA flags (module doc), appended to ``p``."""
    on = bool(cfg.lora_rank) or bool(cfg.lora_load)
    if cfg.lora_rank < 0:
        p.append(f"--lora-rank must be >= 0 (0 = full fine-tuning), got {cfg.lora_rank}")
        return
    if not on:
        stray = [f for f in ("lora_alpha", "lora_dropout", "lora_target_modules") if getattr(cfg, f) is not None]
        if stray:
            p.append(f"{', '.join('--' + f.replace('_', '-') for f in stray)} without --lora-rank or --lora-load "
                     f"does nothing (full fine-tuning)")
        return
    if cfg.lora_rank and rank_problem(cfg.lora_rank):
        p.append(rank_problem(cfg.lora_rank))
    if cfg.lora_alpha is not None and alpha_problem(cfg.lora_alpha):
        p.append(alpha_problem(cfg.lora_alpha))
    if cfg.lora_dropout is not None and not 0.0 <= cfg.lora_dropout < 1.0:
        p.append(f"--lora-dropout must be in [0, 1), got {cfg.lora_dropout:g}")
    _combination_problems(cfg, p)
    if cfg.lora_load:
        n = len(p)
        _load_problems(cfg, p)
        if len(p) > n:
            return
    if check_files:
        _model_problems(cfg, p)

"""The automatic choices of a run: a ``Config``'s flags turned into the inputs of ``slick.config.auto``'s pure
functions. ``slick.configure.plan.derive_plan`` calls these only for flags the user left unset."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from slick.cluster.layout import trainer_ranks, uses_ray
from slick.config.auto import (FALLBACK_ENGINE_SLOTS, LEAN_DEFAULTS, Choice, Machine, ModelShape, Training,
                               engine_slots, fallback_micro_batch, lean_choice, lean_defaults_named, machine_now,
                               micro_batch_tokens, offload_choice)
from slick.models.check import read_model_config
from slick.serve.sglang_args import engine_options

_DEBUG_FLAGS = ("debug_rollout_only", "debug_train_only", "load_debug_rollout_data")


def offload_blockers(cfg, driver: str, engine_actors: int) -> list[str]:
    """Why --offload-rollout cannot apply to this run (empty: it can); the same conditions under which
    ``slick.configure.validate.offload_problems`` refuses the flag."""
    out = []
    if driver != "sync":
        out.append("slick train-async generates while the trainer steps")
    if engine_actors:
        out.append("the engines are actors of their own")
    elif cfg.rollout_engine != "local":
        out.append(f"--rollout-engine {cfg.rollout_engine} engines run in processes of their own")
    out += [f"{'--' + name.replace('_', '-')} has no weight sync after a step" for name in _DEBUG_FLAGS
            if getattr(cfg, name)]
    return out


def offload_rollout_choice(cfg, driver: str, engine_actors: int) -> Choice:
    return offload_choice(offload_blockers(cfg, driver, engine_actors))


def training_of(cfg, offload: bool, checkpointing: bool, engine_in_process: bool, device: str) -> Training:
    """The memory-relevant settings of ``cfg`` (``--dtype auto`` resolved for ``device``)."""
    if cfg.dtype == "auto":
        from slick.train.precision import cpu_has_fast_bf16   # import cost: torch, only when a budget is sized

        bf16 = device == "cuda" or cpu_has_fast_bf16()
    else:
        bf16 = cfg.dtype == "bf16"
    seq = engine_sequence(cfg)
    lora = bool(getattr(cfg, "lora_rank", None) or getattr(cfg, "lora_load", None))   # PEFT: HF layers, frozen base
    return Training(
        matmul_bytes=2 if bf16 else 4, scheme=cfg.train_precision if bf16 else "fp32",
        exp_avg_bytes=2 if cfg.exp_avg_dtype == "bf16" else 4,
        exp_avg_sq_bytes=2 if cfg.exp_avg_sq_dtype == "bf16" else 4,
        fused_layers=not (cfg.disable_fused_layers or lora), frozen_base=lora, recompute_mlp=bool(cfg.recompute_mlp),
        gradient_checkpointing=checkpointing, logprob_chunk=cfg.logprob_chunk_size,
        has_ref=bool((cfg.use_kl_loss and cfg.kl_loss_coef > 0) or cfg.kl_coef > 0),
        critic=cfg.advantage_estimator == "ppo" and not cfg.debug_rollout_only,
        engine_in_process=engine_in_process, engine_released=bool(offload),
        engine_tokens=(cfg.engine_max_running or FALLBACK_ENGINE_SLOTS) * seq,
        ranks=trainer_ranks(cfg) if uses_ray(cfg) else 1)


def engine_sequence(cfg) -> int:
    """The longest sequence the engine is planned for: --rollout-max-prompt-len (256 when unbounded) plus the
    longer of the rollout's and the evaluation's response lengths."""
    response = max(cfg.rollout_max_response_len, cfg.eval_max_response_len or 0)
    return (cfg.rollout_max_prompt_len or 256) + response


def runs_own_engine(cfg) -> bool:
    """slick's own engine generates: in process, in `slick serve` workers it launches, or in engine actors on Ray
    (not vLLM or SGLang servers, nor servers already running at --rollout-urls)."""
    return cfg.rollout_engine == "local" or (cfg.rollout_engine == "http" and not cfg.rollout_urls)


def engine_slots_choice(cfg, driver: str, offload: bool, checkpointing: bool, engine_in_process: bool,
                        machine: Optional[Machine] = None) -> Choice:
    """--engine-max-running for a run of ``driver`` ("sync" or "async") that leaves it unset:
    :func:`slick.config.auto.engine_slots` for this run, or
    ``FALLBACK_ENGINE_SLOTS`` when its memory cannot be sized (``--sglang-max-running-requests`` N: N, not logged)."""
    try:
        given = engine_options(dict(cfg.sglang or {}))[0].get("max_running")
    except ValueError:   # the engine's start-up names the flag and its value
        given = None
    if given is not None:
        return Choice(given, "")
    sizing = _sizing(cfg, offload, checkpointing, engine_in_process, machine)
    if isinstance(sizing, str):
        return Choice(FALLBACK_ENGINE_SLOTS, f"auto: the engine decodes up to {FALLBACK_ENGINE_SLOTS} sequences at "
                                             f"once ({sizing}); --engine-max-running to override")
    shape, machine, t, _ = sizing
    return engine_slots(shape, machine, t, engine_sequence(cfg), overlap=driver == "async")


def _device(cfg) -> str:
    if cfg.device in (None, "", "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if str(cfg.device).startswith("cuda") else "cpu"


def _sizing(cfg, offload: bool, checkpointing: bool, engine_in_process: bool, machine: Optional[Machine]):
    """(shape, machine, training, longest sample or None) for the memory-sized choices, or a ``str``: why they
    cannot be sized (the trainer's memory is out of sight, or no model shape)."""
    if cfg.ray_address:
        return "the trainer ranks run on the Ray cluster at --ray-address, whose memory slick cannot see at start-up"
    try:
        shape = ModelShape.from_config(read_model_config(cfg.hf_checkpoint))
    except (TypeError, OSError, ValueError, KeyError) as e:
        where = Path(str(cfg.hf_checkpoint)) / "config.json" if cfg.hf_checkpoint else "--hf-checkpoint unset"
        return f"no model shape from {where}: {type(e).__name__}"
    device = machine.device if machine else _device(cfg)
    machine = machine or machine_now(device)
    t = training_of(cfg, offload, checkpointing, engine_in_process, device)
    if not shape.fusable:   # the layers run their HF forward
        t = dataclasses.replace(t, fused_layers=False)
    max_seq = cfg.rollout_max_prompt_len + cfg.rollout_max_response_len if cfg.rollout_max_prompt_len else None
    return shape, machine, t, max_seq


def micro_batch_choice(cfg, offload: bool, checkpointing: bool, engine_in_process: bool,
                       machine: Optional[Machine] = None) -> Choice:
    """--max-tokens-per-micro-batch for a run that sets neither it nor --micro-batch-size: sized by
    :func:`slick.config.auto.micro_batch_tokens` from the checkpoint's config.json, the length flags and
    ``machine`` (default: this machine now), or a sample count when one of them cannot be known."""
    if cfg.debug_rollout_only:
        return Choice(None, "auto: no micro-batches (--debug-rollout-only trains nothing)")
    sizing = _sizing(cfg, offload, checkpointing, engine_in_process, machine)
    if isinstance(sizing, str):
        return fallback_micro_batch(sizing)
    shape, machine, t, max_seq = sizing
    return micro_batch_tokens(shape, machine, t, max_seq, cfg.rollout_max_response_len)


def lean_settings_choice(cfg, offload: bool, checkpointing: bool, engine_in_process: bool,
                         machine: Optional[Machine] = None) -> Choice:
    """The lean flags left unset (--exp-avg-dtype, --exp-avg-sq-dtype, --recompute-mlp) as {field: value}:
    :func:`slick.config.auto.lean_choice` for this run, or their defaults when memory cannot be sized."""
    unset = frozenset(f for f in LEAN_DEFAULTS if getattr(cfg, f) is None)
    sizing = _sizing(cfg, offload, checkpointing, engine_in_process, machine)
    if isinstance(sizing, str) or cfg.debug_rollout_only:
        value = {f: LEAN_DEFAULTS[f] for f in unset}
        return Choice(value, f"auto: {', '.join(lean_defaults_named(value))} "
                             f"({'nothing is trained' if cfg.debug_rollout_only else sizing})")
    shape, machine, t, max_seq = sizing
    return lean_choice(shape, machine, t, max_seq, unset)

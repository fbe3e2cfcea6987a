"""``Plan``: the values validation derives from the flags, kept apart from the config the user gave.

``validate(cfg)`` (``slick.configure.validate``) reads the user's ``Config`` and never writes to it: it
derives a frozen :class:`Plan`, checks ``plan.apply(cfg)`` (a new ``Config`` with the derived values in
place of the unset or ``auto`` ones) and returns both. Each field of the plan is the resolved value of
the flag of the same name:

* ``global_batch_size`` / ``num_steps_per_rollout``: the one left unset follows from the other and
  ``--rollout-batch-size`` x ``--n-samples-per-prompt`` (both unset: one optimizer step per rollout);
* ``weight_transport``: ``auto`` becomes ``colocated`` when the engines share the trainer's process, else ``disk``;
* ``max_staleness``: slick train with ``--update-weights-interval`` N > 1 raises it to the lag that interval
  allows, (N - 1) x ``num_steps_per_rollout``;
* ``gradient_checkpointing``: Megatron's recompute flags (``--recompute-activations``,
  ``--recompute-granularity``) turn it on;
* ``max_tokens_per_micro_batch``: unset with ``--micro-batch-size`` unset too, a token budget sized from the
  model, the sequence lengths and the memory available (``slick.config.auto``);
* ``engine_max_running``: unset, where slick's own engine generates, up to 256 sequences at once (64 in slick
  train-async), fewer when their KV cache would not fit the memory (``slick.config.auto.engine_slots``);
* ``offload_rollout``: unset (neither ``--offload-rollout`` nor ``--no-offload-rollout``), on wherever it can apply;
* ``exp_avg_dtype``, ``exp_avg_sq_dtype``, ``recompute_mlp``: unset, MLP recomputation and (bf16 training) bf16
  moments on a CPU; on a GPU fp32 moments and kept MLP activations unless memory is short
  (``slick.config.auto.lean_choice``).

``auto`` keeps the automatic choices with the line each logs (what and why), once the config is valid.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Optional

from slick.cluster.layout import trainer_ranks, uses_ray
from slick.config.auto import LEAN_DEFAULTS, Choice, Machine
from slick.configure.autoplan import (engine_slots_choice, lean_settings_choice, micro_batch_choice,
                                   offload_rollout_choice, runs_own_engine)
from slick.config.config import Config
from slick.config.megatron import recompute_requested


@dataclass(frozen=True)
class Plan:
    global_batch_size: Optional[int]
    num_steps_per_rollout: Optional[int]
    weight_transport: str
    max_staleness: int
    gradient_checkpointing: bool
    max_tokens_per_micro_batch: Optional[int] = None
    offload_rollout: Optional[bool] = None
    exp_avg_dtype: Optional[str] = None
    exp_avg_sq_dtype: Optional[str] = None
    recompute_mlp: Optional[bool] = None
    engine_max_running: Optional[int] = None
    # the automatic choices made (slick.config.auto.Choice: value and the line logged); not a flag
    auto: tuple = dataclasses.field(default=(), compare=False, repr=False, metadata={"flag": False})

    def changes(self, cfg: Config) -> dict:
        """{flag field: derived value} for each value the plan sets differently from ``cfg``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata.get("flag", True) and getattr(cfg, f.name) != getattr(self, f.name)}

    def apply(self, cfg: Config) -> Config:
        """A new ``Config``: a deep copy of ``cfg`` with the derived values; ``cfg`` is left as it is."""
        out = copy.deepcopy(cfg)
        for name, value in self.changes(cfg).items():
            setattr(out, name, value)
        return out


def num_engine_actors(cfg: Config) -> int:
    """Slick-managed engine actors: --rollout-num-gpus / --rollout-num-gpus-per-engine; with --colocate on Ray,
    one per trainer rank when --rollout-num-gpus is 0. 0: the engine --rollout-engine picks."""
    if cfg.colocate and uses_ray(cfg):
        return cfg.rollout_num_gpus or trainer_ranks(cfg)
    return max(cfg.rollout_num_gpus, 0) // max(cfg.rollout_num_gpus_per_engine, 1)


def engines_share_trainer_process(cfg: Config) -> bool:
    """The in-process engine in the driver, or one engine inside each trainer rank's actor (--colocate)."""
    engines = num_engine_actors(cfg)
    in_driver = cfg.rollout_engine == "local" and not engines
    return in_driver or (cfg.colocate and engines > 0)


def derive_batch_sizes(cfg: Config, problems: list[str]) -> tuple[Optional[int], Optional[int]]:
    """(global_batch_size, num_steps_per_rollout), the unset one derived; a mismatch is a problem."""
    samples = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    gbs, steps = cfg.global_batch_size, cfg.num_steps_per_rollout
    if gbs is None and steps is None:
        return samples, 1
    if gbs is None:
        if steps <= 0 or samples % steps:
            problems.append(f"--num-steps-per-rollout {steps} does not divide rollout_batch_size x "
                            f"n_samples_per_prompt = {samples}")
            return gbs, steps
        return samples // steps, steps
    if steps is None:
        if gbs <= 0 or samples % gbs:
            problems.append(f"--global-batch-size {gbs} does not divide rollout_batch_size x "
                            f"n_samples_per_prompt = {samples}")
            return gbs, steps
        return gbs, samples // gbs
    if gbs * steps != samples:
        problems.append(
            f"batch sizes disagree: rollout_batch_size x n_samples_per_prompt = {cfg.rollout_batch_size} x "
            f"{cfg.n_samples_per_prompt} = {samples}, but global_batch_size x num_steps_per_rollout = "
            f"{gbs} x {steps} = {gbs * steps}")
    return gbs, steps


def derive_plan(cfg: Config, driver: str, problems: list[str], machine: Optional[Machine] = None) -> Plan:
    """The plan of ``cfg`` for ``driver`` ("sync" or "async"); reads ``cfg`` only. Problems found while
    deriving (batch sizes that do not divide) are appended to ``problems``. ``machine``: the memory and cores
    the automatic choices size for (default: this machine now, read only when a choice needs it)."""
    gbs, steps = cfg.global_batch_size, cfg.num_steps_per_rollout
    if cfg.rollout_batch_size <= 0:
        problems.append("--rollout-batch-size must be positive")
    if cfg.n_samples_per_prompt <= 0:
        problems.append("--n-samples-per-prompt must be positive")
    if not problems:
        gbs, steps = derive_batch_sizes(cfg, problems)
    transport = cfg.weight_transport
    if transport == "auto":
        transport = "colocated" if engines_share_trainer_process(cfg) else "disk"
    staleness, interval = cfg.max_staleness, cfg.update_weights_interval
    if driver == "sync" and steps and interval > 1:
        # engines lag the trainer by up to (interval - 1) rollouts of optimizer steps: allow that staleness
        staleness = max(staleness, (interval - 1) * steps)
    checkpointing = True if recompute_requested(cfg) else bool(cfg.gradient_checkpointing)
    auto: list[Choice] = []
    offload = cfg.offload_rollout
    if offload is None:
        auto.append(offload_rollout_choice(cfg, driver, num_engine_actors(cfg)))
        offload = auto[-1].value
    in_process = engines_share_trainer_process(cfg)
    cfg = copy.deepcopy(cfg)              # a copy with each choice made, for the choices after it
    if cfg.engine_max_running is None and runs_own_engine(cfg):
        slots = engine_slots_choice(cfg, driver, offload, checkpointing, in_process, machine)
        auto += [slots] if slots.reason else []
        cfg.engine_max_running = slots.value
    lean = {f: getattr(cfg, f) for f in LEAN_DEFAULTS}
    if None in lean.values():
        auto.append(lean_settings_choice(cfg, offload, checkpointing, in_process, machine))
        lean.update(auto[-1].value)
        for name, value in lean.items():
            setattr(cfg, name, value)
    whole_layers = bool(lean.pop("gradient_checkpointing"))
    checkpointing = checkpointing or whole_layers        # the flag, Megatron's recompute flags, or short memory
    tokens = cfg.max_tokens_per_micro_batch
    if tokens is None and cfg.micro_batch_size is None:
        auto.append(micro_batch_choice(cfg, offload, checkpointing, in_process, machine))
        tokens = auto[-1].value
    return Plan(global_batch_size=gbs, num_steps_per_rollout=steps, weight_transport=transport,
                max_staleness=staleness, gradient_checkpointing=checkpointing,
                max_tokens_per_micro_batch=tokens, offload_rollout=offload, engine_max_running=cfg.engine_max_running,
                auto=tuple(auto), **lean)

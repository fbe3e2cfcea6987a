"""Checks run before any model is loaded. Every problem is reported, one per line.

Names of estimators and reward types come from their registries (``slick.algo.estimators``,
``slick.reward.registry``), imported here only when a config is validated.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from slick.chat.toolcall import PARSERS
from slick.cluster.layout import trainer_ranks, uses_ray
from slick.config.auto import log_choices
from slick.config.config import Config, ConfigError
from slick.config.engine_checks import server_engine_problems
from slick.config.fields import field_choices, flag_name
from slick.config.groups import GROUPS
from slick.configure.envs import env_problems, is_generated
from slick.configure.lora import lora_problems
from slick.config.megatron import megatron_problems, shape_problems
from slick.config.objectives import objective_problems   # --policy-loss, OPSM, entropy mask, DAPO
from slick.config.sft_distill import sft_distill_problems
from slick.config.slime import idle_flag_warnings, load_problems, ref_load_problem   # slime scripts' --load/--ref-load
from slick.configure.plan import Plan, derive_plan, engines_share_trainer_process, num_engine_actors
from slick.models.check import model_dir_problems, read_model_config
from slick.plugins import load_function
from slick.reward.registry import REMOTE, get_score_fn, known_types
from slick.rollout.tools import load_tools
from slick.ckpt.output_dirs import config_problems as output_dir_problems   # no output replaces data

ROLLOUT_URLS_HINT = "launch SGLang servers yourself and pass --rollout-engine http --rollout-urls URL ..."


def _data_path(spec: str) -> str:
    """Strip a `@[start:end]` slice from a dataset spec."""
    return spec.split("@[", 1)[0]


def choice_problems(cfg: Config, problems: list[str]) -> None:
    """Values outside a field's choices (argparse checks flags; this also covers YAML and ``Config``)."""
    for cls in GROUPS.values():
        for f in dataclasses.fields(cls):
            value = getattr(cfg, f.name)
            if value is None or ("choices" not in f.metadata and "choices_from" not in f.metadata):
                continue
            choices = field_choices(f)
            if value not in choices:
                problems.append(f"unknown {flag_name(f.name)} '{value}' (choose from {', '.join(map(str, choices))})")


def rm_type_problems(cfg: Config, problems: list[str]) -> None:
    rm = cfg.rm_type
    if not rm or cfg.custom_rm_path:
        return
    if rm == REMOTE:
        if not cfg.rm_url:
            problems.append(f"--rm-type {REMOTE} needs --rm-url")
        return
    try:
        get_score_fn(rm)
    except ValueError as e:
        if str(e).startswith("--rm-type"):     # refused by name, with what to use (slick/reward/slime_rm.py)
            problems.append(str(e))
            return
        problems.append(f"unknown --rm-type '{rm}' (choose from {', '.join(known_types())}, "
                        f"or boxed_<type> for a rule type)")


def _ray_address_problem(addr: str) -> Optional[str]:
    if addr == "auto":
        return None
    if addr.startswith(("http://", "https://")):
        return (f"--ray-address '{addr}': that is the dashboard's address, which `ray job submit --address` "
                f"takes; slick joins the cluster's GCS: HOST:PORT (e.g. 127.0.0.1:6379), ray://HOST:PORT, or auto")
    rest = addr[len("ray://"):] if addr.startswith("ray://") else addr
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return (f"--ray-address '{addr}': expected HOST:PORT of the cluster's GCS (e.g. 127.0.0.1:6379, what "
                f"`ray start --head` prints), ray://HOST:PORT, or auto")
    return None


def cluster_problems(cfg: Config, problems: list[str]) -> None:
    """Every cluster flag is honoured or refused; none is silently ignored (docs/cluster.md lists the refusals).
    Resolves --weight-transport auto to the transport the layout uses."""
    p = problems
    if cfg.ray_address is not None:
        p += filter(None, [_ray_address_problem(cfg.ray_address)])
    if cfg.actor_num_nodes < 1:
        p.append(f"--actor-num-nodes {cfg.actor_num_nodes}: must be >= 1")
    if cfg.actor_num_gpus_per_node < 0:
        p.append(f"--actor-num-gpus-per-node {cfg.actor_num_gpus_per_node}: must be >= 0")
    elif cfg.actor_num_nodes > 1 and cfg.actor_num_gpus_per_node == 0:
        p.append(f"--actor-num-nodes {cfg.actor_num_nodes} needs --actor-num-gpus-per-node >= 1 (trainer ranks = "
                 f"nodes x GPUs per node; 0 means one trainer in the driver process)")
    if cfg.rollout_num_gpus < 0:
        p.append(f"--rollout-num-gpus {cfg.rollout_num_gpus}: must be >= 0")
    if cfg.rollout_num_gpus_per_engine != 1:
        p.append(f"--rollout-num-gpus-per-engine {cfg.rollout_num_gpus_per_engine}: only 1 (slick's engine has no "
                 f"tensor parallelism): for tensor-parallel engines {ROLLOUT_URLS_HINT} (start each with --tp N)")
    if cfg.rollout_num_gpus > 0 and cfg.rollout_urls:
        p.append(f"--rollout-num-gpus {cfg.rollout_num_gpus} starts slick's own engine actors, but --rollout-urls "
                 f"names servers to use: drop one of them")
    elif cfg.rollout_num_gpus > 0 and cfg.rollout_num_workers != 1:
        p.append(f"--rollout-num-gpus {cfg.rollout_num_gpus} starts slick's own engine actors, but "
                 f"--rollout-num-workers {cfg.rollout_num_workers} launches `slick serve` workers: drop one of them")
    if cfg.colocate and cfg.rollout_urls:
        p.append("--colocate needs slick's own engines (in process, or in the trainer ranks' actors): "
                 "--rollout-urls engines run in processes of their own")
    elif cfg.colocate and cfg.rollout_engine != "local" and not uses_ray(cfg):
        p.append(f"--colocate needs slick's own engines (in process, or in the trainer ranks' actors): "
                 f"--rollout-engine {cfg.rollout_engine} launches `slick serve` workers in processes of their own")
    ranks = trainer_ranks(cfg)
    if cfg.colocate and cfg.rollout_num_gpus > 0 and cfg.rollout_num_gpus != ranks:
        p.append(f"--colocate runs one engine in each trainer rank's actor: --rollout-num-gpus {cfg.rollout_num_gpus} "
                 f"must be 0 or equal the {ranks} trainer rank(s) (--actor-num-nodes {cfg.actor_num_nodes} x "
                 f"--actor-num-gpus-per-node {cfg.actor_num_gpus_per_node})")
    _transport_problems(cfg, p)
    for name in ("weight_bucket_mb", "dist_timeout", "ray_start_timeout"):
        if getattr(cfg, name) <= 0:
            p.append(f"{flag_name(name)} must be > 0 (got {getattr(cfg, name)})")
    fault_problems(cfg, p)
    server_engine_problems(cfg, p)


def fault_problems(cfg: Config, p: list[str]) -> None:
    """--use-fault-tolerance and the --rollout-health-check-* values."""
    for name in ("rollout_health_check_interval", "rollout_health_check_timeout"):
        if getattr(cfg, name) <= 0:
            p.append(f"{flag_name(name)} must be > 0 (got {getattr(cfg, name)})")
    if cfg.rollout_health_check_first_wait < 0:
        p.append(f"--rollout-health-check-first-wait must be >= 0 (got {cfg.rollout_health_check_first_wait})")
    if not cfg.use_fault_tolerance:
        return
    if cfg.rollout_engine == "local" and not num_engine_actors(cfg):
        p.append("--use-fault-tolerance restarts engine processes: it needs --rollout-engine http, vllm or sglang "
                 "(servers slick launches) or engine actors on Ray; the in-process engine (--rollout-engine local) "
                 "has none")
    elif cfg.rollout_urls:
        p.append("--use-fault-tolerance restarts engines slick launched: the engines at --rollout-urls are not "
                 "slick's to restart (drop --rollout-urls to let slick launch --rollout-num-workers workers)")
    elif cfg.colocate:
        p.append("--use-fault-tolerance: engines inside the trainer ranks' actors (--colocate) cannot be restarted "
                 "alone; use separate engine actors")
    elif cfg.weight_transport not in ("auto", "disk"):
        p.append(f"--use-fault-tolerance brings a replacement engine to the current weights from the disk transport's "
                 f"directory: --weight-transport {cfg.weight_transport} is not supported with it (use disk)")


def _transport_problems(cfg: Config, p: list[str]) -> None:
    """--weight-transport: impossible choices are refused (the plan resolves auto to what the layout uses)."""
    engines = num_engine_actors(cfg)
    if cfg.weight_transport == "colocated" and not engines_share_trainer_process(cfg):
        where = (f"the {engines} engine actor(s) of --rollout-num-gpus without --colocate" if engines
                 else f"--rollout-engine {cfg.rollout_engine} engines")
        p.append(f"--weight-transport colocated needs engines that share the trainer's process (the in-process "
                 f"engine, or --colocate): {where} run in processes of their own; use disk or broadcast")


def offload_problems(cfg: Config, driver: str, p: list[str]) -> None:
    """--offload-rollout frees the in-process engine between its rollout and the weight sync that refills it."""
    if not cfg.offload_rollout:
        return
    if driver != "sync":
        p.append("--offload-rollout is for slick train: in slick train-async the engine generates while the "
                 "trainer steps")
    if cfg.rollout_engine != "local" or num_engine_actors(cfg):
        where = "engine actors (--rollout-num-gpus / --colocate on Ray)" if num_engine_actors(cfg) else \
            f"--rollout-engine {cfg.rollout_engine} engines"
        p.append(f"--offload-rollout frees the in-process engine's memory; {where} run in processes of their own")
    for name in ("debug_rollout_only", "debug_train_only", "load_debug_rollout_data"):
        if getattr(cfg, name):
            p.append(f"--offload-rollout needs the weight sync after each step to refill the engine; "
                     f"{flag_name(name)} has none")


def checkpoint_problems(cfg: Config, problems: list[str]) -> None:
    """--hf-checkpoint (and --ref-load) are local HF directories; the megatron shape flags match the former."""
    if not cfg.hf_checkpoint:
        problems.append("--hf-checkpoint is required (a local Hugging Face model directory)")
    else:
        found = model_dir_problems(cfg.hf_checkpoint, "--hf-checkpoint")
        problems += found
        if not found:
            source = str(Path(cfg.hf_checkpoint) / "config.json")
            problems += shape_problems(cfg, read_model_config(cfg.hf_checkpoint), source)
    if cfg.ref_load:
        megatron = ref_load_problem(cfg.ref_load)
        problems += [megatron] if megatron else model_dir_problems(cfg.ref_load, "--ref-load", tokenizer=False)
    load_problems(cfg, problems)
    retention_problems(cfg, problems)


def retention_problems(cfg: Config, p: list[str]) -> None:
    """--keep-checkpoints K >= 1 and --save-retain-interval N >= 1, both only with --save."""
    for flag, v in (("--keep-checkpoints", cfg.keep_checkpoints), ("--save-retain-interval", cfg.save_retain_interval)):
        if v is not None and v < 1:
            p.append(f"{flag} must be >= 1 (got {v})")
        if v is not None and not cfg.save:
            p.append(f"{flag} applies to the checkpoints in --save; set --save DIR")


ASYNC_ONLY = {"async_buffer_size": None, "async_weight_update": "wait", "async_timeout": 600.0}
NOT_ASYNC = ("partial_rollout", "over_sampling_batch_size", "rollout_function_path", "debug_rollout_only",
             "load_debug_rollout_data", "rollout_sample_filter_path", "rollout_all_samples_process_path")


def async_lead(cfg: Config) -> int:
    """Rollout steps the async producer may run ahead of the trainer: the largest L with
    L * k + (k - 1) <= N (k optimizer steps per rollout, N = --max-staleness)."""
    return (cfg.max_staleness + 1) // cfg.num_steps_per_rollout - 1


def driver_problems(cfg: Config, driver: str, p: list[str]) -> None:
    """Flags that only one driver uses, and what slick train-async needs to keep its staleness bound."""
    if driver == "sync":
        for name, default in ASYNC_ONLY.items():
            if getattr(cfg, name) != default:
                p.append(f"{flag_name(name)} is for slick train-async only (slick train is synchronous)")
        return
    for name in NOT_ASYNC:
        if getattr(cfg, name):
            p.append(f"{flag_name(name)} is not supported by slick train-async (use slick train)")
    if cfg.async_buffer_size is not None and cfg.async_buffer_size < 1:
        p.append(f"--async-buffer-size must be >= 1 (got {cfg.async_buffer_size})")
    if cfg.async_timeout <= 0:
        p.append(f"--async-timeout must be > 0 (got {cfg.async_timeout})")
    k, n, interval = cfg.num_steps_per_rollout, cfg.max_staleness, cfg.update_weights_interval
    if not k or interval < 1:
        return
    lead = async_lead(cfg)
    if lead < 0:
        p.append(f"--max-staleness {n} cannot be met with {k} optimizer steps per rollout "
                 f"(--num-steps-per-rollout / --global-batch-size): the last one trains on the batch {k - 1} "
                 f"versions after the first; use --max-staleness >= {k - 1}")
    elif lead < interval - 1:
        p.append(f"--update-weights-interval {interval} leaves the engines up to {interval - 1} rollout steps "
                 f"behind, which --max-staleness {n} does not allow with {k} optimizer step(s) per rollout; "
                 f"use --max-staleness >= {interval * k - 1}")
    elif (lead > 0 or k > 1) and not (cfg.use_tis or cfg.use_rollout_logprobs):
        p.append(f"--max-staleness {n} trains on samples from older policies but no off-policy correction is "
                 f"chosen: add --use-tis (decoupled PPO: clip against the current policy, weight by the truncated "
                 f"behaviour ratio; docs/async.md) or --use-rollout-logprobs (clip against the behaviour policy)")


def agent_problems(cfg: Config, p: list[str]) -> None:
    """Multi-turn flags (docs/agents.md): each one does what it says or is refused."""
    multi = bool(cfg.tool_path or cfg.environment_path or cfg.environment or cfg.mcp_server or cfg.mcp_url)
    custom = cfg.custom_generate_function_path or cfg.rollout_function_path
    if cfg.max_turns < 1:
        p.append(f"--max-turns must be >= 1 (got {cfg.max_turns})")
    elif cfg.max_turns > 1 and not multi and not custom:
        p.append(f"--max-turns {cfg.max_turns} needs --tool-path or --environment-path, or an MCP server "
                 "(--mcp-server/--mcp-url): nothing would answer the policy's turns")
    elif multi and cfg.max_turns == 1 and (cfg.tool_path or cfg.environment_path):   # MCP: slick/configure/envs.py
        flag = "--tool-path" if cfg.tool_path else "--environment-path"
        p.append(f"{flag} needs --max-turns >= 2 (with one turn no tool result or observation is ever read)")
    for flag, value in (("--custom-generate-function-path", cfg.custom_generate_function_path),
                        ("--rollout-function-path", cfg.rollout_function_path)):
        if value and multi:
            p.append(f"{flag} replaces the built-in multi-turn rollout that --tool-path/--mcp-server/--mcp-url/"
                     "--environment-path select: use one or the other (a custom generate can use "
                     "slick.rollout.multiturn's helpers and read args.max_turns)")
    if cfg.max_tokens_per_turn is not None and cfg.max_tokens_per_turn < 1:
        p.append(f"--max-tokens-per-turn must be >= 1 (got {cfg.max_tokens_per_turn})")
    if cfg.tool_timeout <= 0:
        p.append(f"--tool-timeout must be > 0 seconds (got {cfg.tool_timeout})")
    if cfg.tool_max_output_chars < 1:
        p.append(f"--tool-max-output-chars must be >= 1 (got {cfg.tool_max_output_chars})")

    checks = [(load_tools, cfg.tool_path), (load_function, cfg.environment_path, "--environment-path")]
    if (cfg.tool_path or cfg.mcp_server or cfg.mcp_url) and cfg.tool_parser not in PARSERS:
        checks.append((load_function, cfg.tool_parser, "--tool-parser"))
    for fn, *args in checks:  # plug-ins load before any model does, so a typo costs no model load
        if args[0]:
            try:
                fn(*args)
            except ValueError as e:
                p.append(str(e))


def black_box_agent_problems(cfg: Config, p: list[str]) -> None:
    """--agent-function-path (docs/agents.md, black-box agents): the agent replaces generation for every sample."""
    if cfg.agent_timeout <= 0:
        p.append(f"--agent-timeout must be > 0 seconds (got {cfg.agent_timeout})")
    if cfg.agent_max_calls < 1:
        p.append(f"--agent-max-calls must be >= 1 (got {cfg.agent_max_calls})")
    if not cfg.agent_function_path:
        return
    clash = [flag for flag, on in (("--custom-generate-function-path", cfg.custom_generate_function_path),
                                   ("--tool-path", cfg.tool_path), ("--environment-path", cfg.environment_path),
                                   (f"--max-turns {cfg.max_turns}", cfg.max_turns > 1)) if on]
    if clash:
        p.append(f"--agent-function-path generates every sample through the agent's own calls; it cannot be "
                 f"combined with {', '.join(clash)} (the agent runs its own turns and tools)")
    if cfg.partial_rollout:
        p.append("--partial-rollout cannot continue a black-box agent session (--agent-function-path): an aborted "
                 "session starts over")


def critic_problems(cfg: Config, p: list[str]) -> None:
    """PPO's critic flags (docs/algorithms.md, "PPO with a critic"): only with --advantage-estimator ppo, which always
    trains a critic."""
    defaults = {f.name: f.default for f in dataclasses.fields(GROUPS["critic"])}
    if cfg.advantage_estimator != "ppo":
        for name, default in defaults.items():
            if getattr(cfg, name) != default:
                p.append(f"{flag_name(name)} configures PPO's critic, but --advantage-estimator is "
                         f"{cfg.advantage_estimator} (no critic is trained): use --advantage-estimator ppo or drop it")
        return
    if cfg.value_clip <= 0:
        p.append(f"--value-clip must be > 0 (got {cfg.value_clip})")
    if cfg.critic_lr is not None and cfg.critic_lr <= 0:
        p.append(f"--critic-lr must be > 0 (got {cfg.critic_lr})")
    if cfg.critic_lr_warmup_iters < 0:
        p.append(f"--critic-lr-warmup-iters must be >= 0 (got {cfg.critic_lr_warmup_iters})")
    if cfg.num_critic_only_steps < 0:
        p.append(f"--num-critic-only-steps must be >= 0 (got {cfg.num_critic_only_steps})")
    k = cfg.critic_num_steps_per_rollout
    samples = cfg.rollout_batch_size * cfg.n_samples_per_prompt
    if k is not None and (k < 1 or samples % k):
        p.append(f"--critic-num-steps-per-rollout {k} does not divide rollout_batch_size x n_samples_per_prompt = "
                 f"{samples}")
    if cfg.critic_load and not Path(cfg.critic_load).is_dir():
        p.append(f"--critic-load: directory not found: {cfg.critic_load}")


def algo_plugin_problems(cfg: Config, p: list[str]) -> None:
    """--custom-advantage-function-path / --custom-loss-function-path load and take the dataclass signature
    (slick.algo.inputs), before any model loads."""
    # import cost: torch; `import slick.config` stays free of it (tests/test_config_registry.py)
    from slick.algo.inputs import check_plugin_signature

    for which in ("advantage", "loss"):
        flag = f"--custom-{which}-function-path"
        try:
            fn = load_function(getattr(cfg, f"custom_{which}_function_path"), flag)
            if fn is not None:
                check_plugin_signature(fn, flag)
        except ValueError as e:
            p.append(str(e))


def rollout_store_problems(cfg: Config, p: list[str]) -> None:
    if cfg.mismatch_probe_interval < 1:
        p.append(f"--mismatch-probe-interval must be >= 1 (--mismatch-probe-samples 0 turns the probe off), got "
                 f"{cfg.mismatch_probe_interval}")
    if cfg.rollout_store_interval < 0:
        p.append(f"--rollout-store-interval must be >= 0 (0 = no store), got {cfg.rollout_store_interval}")
    if cfg.rollout_store_max_mb < 0:
        p.append(f"--rollout-store-max-mb must be >= 0 (0 = unbounded), got {cfg.rollout_store_max_mb}")


def prometheus_problems(cfg: Config, p: list[str]) -> None:
    if cfg.prometheus_port is not None and not 0 <= cfg.prometheus_port <= 65535:
        p.append(f"--prometheus-port must be in 0..65535 (0 = a free port), got {cfg.prometheus_port}")
    if not cfg.prometheus_host:
        p.append("--prometheus-host must not be empty")


def validate_config(cfg: Config, check_files: bool = True, driver: str = "sync") -> Config:
    """The config to run: ``cfg`` with the derived values of its plan, a new ``Config`` (``cfg`` itself is not
    changed); raises ConfigError listing every problem. ``driver`` is "sync" (slick train) or "async"
    (slick train-async). :func:`validate` also returns the :class:`Plan`."""
    return validate(cfg, check_files, driver)[0]


def validate(cfg: Config, check_files: bool = True, driver: str = "sync") -> tuple[Config, Plan]:
    """``(plan.apply(cfg), plan)`` once every check passes on the resolved config; ``cfg`` is only read."""
    p: list[str] = []
    plan = derive_plan(cfg, driver, p)
    cfg = plan.apply(cfg)
    if cfg.kl_coef and cfg.kl_loss_coef:
        p.append("--kl-coef and --kl-loss-coef are both non-zero: use KL in the reward or as a loss, not both")
    if cfg.eps_clip_c is not None and cfg.eps_clip_c <= 1:
        p.append(f"--eps-clip-c must be > 1 (got {cfg.eps_clip_c})")
    if cfg.rollout_temperature <= 0:
        p.append(f"--rollout-temperature must be > 0 for RL rollouts (got {cfg.rollout_temperature})")
    choice_problems(cfg, p)
    rm_type_problems(cfg, p)
    if len(cfg.eval_prompt_data) % 2:
        p.append("--eval-prompt-data takes NAME PATH pairs")
    if cfg.over_sampling_batch_size is not None and cfg.over_sampling_batch_size <= 0:
        p.append("--over-sampling-batch-size must be positive")
    if cfg.rollout_engine == "http" and not cfg.rollout_urls and not cfg.hf_checkpoint:
        p.append("--rollout-engine http needs --rollout-urls or --hf-checkpoint (to launch workers)")
    if cfg.debug_rollout_only and (cfg.save or cfg.save_hf):
        flag = "--save" if cfg.save else "--save-hf"
        p.append(f"{flag} needs a trainer, but --debug-rollout-only builds none (nothing to save)")
    p += output_dir_problems(cfg, check_files)
    cluster_problems(cfg, p)
    megatron_problems(cfg, p)
    driver_problems(cfg, driver, p)
    offload_problems(cfg, driver, p)
    agent_problems(cfg, p)
    black_box_agent_problems(cfg, p)
    env_problems(cfg, p)   # reasoning-gym prompt data, MCP servers (slick/configure/envs.py)
    rollout_store_problems(cfg, p)
    prometheus_problems(cfg, p)
    critic_problems(cfg, p)
    objective_problems(cfg, p)
    algo_plugin_problems(cfg, p)
    lora_problems(cfg, p, check_files)
    sft_distill_problems(cfg, driver, check_files, p)   # SFT, on-policy distillation, LR schedule
    if cfg.recompute_mlp and cfg.disable_fused_layers:
        p.append("--recompute-mlp recomputes inside slick's fused decoder layers, which --disable-fused-layers "
                 "turns off (use --gradient-checkpointing for the HF layers)")
    if cfg.update_weights_interval < 1:
        p.append("--update-weights-interval must be >= 1")   # (the plan raises --max-staleness for N > 1)
    if check_files:
        specs = [("--prompt-data", cfg.prompt_data)] if cfg.prompt_data else []
        specs += [("--eval-prompt-data", s) for s in cfg.eval_prompt_data[1::2]]
        if cfg.load_debug_rollout_data is None and not cfg.prompt_data:
            p.append("--prompt-data is required (or --load-debug-rollout-data)")
        for flag, spec in specs:
            if not is_generated(spec) and not Path(_data_path(spec)).is_file():
                p.append(f"{flag}: file not found: {_data_path(spec)}")
        checkpoint_problems(cfg, p)
    if p:
        raise ConfigError(p)
    idle_flag_warnings(cfg)
    log_choices(plan.auto)   # what the plan chose for unset flags, and why (slick.config.auto)
    return cfg, plan

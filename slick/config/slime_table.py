"""slime's flags that slick has under no name of its own, as one table: each is accepted with what it means in
slick, or refused with a one-line reason naming it (never argparse's usage dump).

Three kinds of row (the flags slick shares with slime, and slime's spellings of slick's flags, are in
``slick.config.slime`` and the typed groups; ``slick slime-check`` reads all of them):

* ``ALWAYS``: what the flag asks for is what slick always does (logged).
* ``NO_OP``: accepted with a warning; the flag picks a kernel, a transport, a placement or a profiler output
  of slime's Megatron/Ray stack, which changes speed or memory, never the numbers a run trains on.
* ``REFUSED``: slick cannot honour it; the reason says why and what to use instead.

Every row takes any number of values (argparse ``nargs='*'``), so a refused flag's values never turn into
"unrecognized arguments". Flags are from THUDM/slime ``slime/utils/arguments.py`` (624b824a) and the
Megatron-LM flags its example scripts pass. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Optional

PREFIX = "slime_t__"      # argparse dests of these rows; removed before the Config is built
log = logging.getLogger("slick.config")

_MEGATRON_HOOK = "a hook into Megatron's trainer; slick's trainer is not Megatron"
_SHAPE = ("a Megatron model-shape flag slick does not check: slick builds the model from --hf-checkpoint's "
          "config.json; drop it")
_WANDB_ENV = "set {env} in the environment (wandb reads it itself)"

ALWAYS: dict[str, str] = {
    "--skip-eval-before-train": "slick never evaluates before the first step (--eval-interval counts trained steps)",
    "--rollout-skip-special-tokens": "slick always decodes responses without special tokens",
    "--log-multi-turn": "slick always logs multi-turn metrics (rollout/turns/*) for multi-turn rollouts",
    "--train-backend": "slick's trainer stands in for slime's only backend, megatron",
    "--use-distributed-optimizer": "slick shards optimizer state over trainer ranks with FSDP2",
}

NO_OP: dict[str, str] = {
    "--allgather-cp": "a context-parallel communication pattern (slick has no context parallelism)",
    "--balance-by-flops": "a micro-batch partition heuristic; slick reduces over the whole step, so the partition "
                          "changes speed, not gradients",
    "--data-pad-size-multiplier": "padding for Megatron kernels; padded tokens carry loss mask 0",
    "--distributed-backend": "slick picks torch.distributed's backend for the device itself",
    "--keep-old-actor": "where slime keeps a model copy (memory, not results)",
    "--log-probs-max-tokens-per-gpu": "a token budget for logprob micro-batches (memory, not results); slick "
                                      "uses --max-tokens-per-micro-batch for both",
    "--megatron-deepgemm-forward-layers": "a Megatron FP8 kernel choice",
    "--megatron-deepgemm-forward-modules": "a Megatron FP8 kernel choice",
    "--megatron-deepgemm-moe-forward-layers": "a Megatron FP8 kernel choice",
    "--megatron-deepgemm-moe-forward-modules": "a Megatron FP8 kernel choice",
    "--qwen-gdn-backend": "a linear-attention kernel choice",
    "--recompute-loss-function": "recomputation to save memory; the loss is the same",
    "--rollout-data-transport": "how slime's Ray actors pass rollout data; slick hands batches over in process",
    "--use-distributed-post": "how slime spreads HTTP posts over processes",
    "--num-gpus-per-node": "slime's rollout placement; slick places engines itself (--rollout-num-gpus)",
    "--async-save": "checkpoint writes overlapping training; slick writes them atomically in line",
    "--update-weight-mode": "full or delta weight sync: the engine receives the same weights either way",
    "--update-weight-delta-checksum": "a checksum of slime's delta weight sync",
    "--update-weight-delta-encoding": "an encoding of slime's delta weight sync",
    "--model-name": "slime's name for its weight converter; slick reads the model type from config.json",
    "--padded-vocab-size": "Megatron's embedding padding; slick uses config.json's vocabulary",
    "--make-vocab-size-divisible-by": "Megatron's embedding padding; slick uses config.json's vocabulary",
    "--rollout-task-type": "slime itself reads it nowhere",
    "--moe-token-dispatcher-type": "a Megatron MoE communication choice",
    "--moe-permute-fusion": "a Megatron MoE kernel fusion",
    "--moe-grouped-gemm": "a Megatron MoE kernel choice",
    "--moe-token-drop-policy": "Megatron drops tokens only with an expert capacity factor, which slick does not "
                               "take; slick's MoE layers drop none",
    "--moe-enable-deepep": "a Megatron MoE communication library",
    "--no-rope-fusion": "a Megatron kernel fusion",
    "--no-masked-softmax-fusion": "a Megatron kernel fusion",
    "--no-gradient-accumulation-fusion": "a Megatron kernel fusion",
    "--transformer-impl": "Megatron's layer implementation (local or transformer_engine)",
    "--use-precision-aware-optimizer": "Megatron's optimizer-state layout (memory); --exp-avg-dtype is slick's",
    "--overlap-cpu-optimizer-d2h-h2d": "Megatron's CPU-offload overlap (speed)",
    "--optimizer-cpu-offload": "Megatron's optimizer offload (memory); slick keeps the optimizer on the device",
    "--no-check-for-nan-in-loss-and-grad": "Megatron's NaN check; slick stops a step with a non-finite loss "
                                           "either way",
    "--decoder-first-pipeline-num-layers": "pipeline placement (slick has no pipeline parallelism)",
    "--decoder-last-pipeline-num-layers": "pipeline placement (slick has no pipeline parallelism)",
}

REFUSED: dict[str, str] = {
    # slime's rollout and data hooks slick has no place for
    "--custom-rollout-log-function-path": "slick logs rollout metrics itself; a plug-in's own metrics come back "
                                          "from a custom rollout function's RolloutFnTrainOutput.metrics",
    "--custom-eval-rollout-log-function-path": "slick logs eval metrics itself (eval/*)",
    "--custom-megatron-init-path": _MEGATRON_HOOK,
    "--custom-megatron-before-log-prob-hook-path": _MEGATRON_HOOK,
    "--custom-megatron-before-train-step-hook-path": _MEGATRON_HOOK,
    "--custom-model-provider-path": _MEGATRON_HOOK + "; slick builds the model from --hf-checkpoint",
    "--megatron-config-path": _MEGATRON_HOOK,
    "--custom-update-weight-post-write-path": "slick's disk weight sync has no per-rank post-write hook",
    "--custom-config-path": "slime's YAML of argument overrides; slick reads YAML with --config",
    "--rollout-buffer-url": "slime's external rollout buffer service; slick's agents use --agent-function-path",
    "--fetch-trajectory-retry-times": "belongs to slime's external rollout buffer (--rollout-buffer-url)",
    "--disable-rollout-global-dataset": "slick's rollout always reads --prompt-data",
    "--min-batch-collection-ratio": "slick's rollout returns exactly --rollout-batch-size groups",
    "--load-debug-rollout-data-subsample": "slick's --load-debug-rollout-data replays every saved sample",
    "--load-forge-rollout-data": "slime's forge replay format; use --save-debug-rollout-data / "
                                 "--load-debug-rollout-data",
    "--multimodal-keys": "slick trains text models only",
    "--apply-chat-template-kwargs": "slick renders chat templates with their own defaults; bake options into "
                                    "the template or the prompts",
    "--loss-mask-type": "slick takes SFT loss masks from the chat template's assistant turns, for any model",
    "--rollout-max-context-len": "slick sizes the engine's context from --rollout-max-prompt-len and "
                                 "--rollout-max-response-len",
    # evaluation variants
    "--eval-config": "give evaluation sets with --eval-prompt-data NAME PATH",
    "--eval-input-key": "slick's evaluation reads --input-key",
    "--eval-label-key": "slick's evaluation reads --label-key",
    "--eval-tool-key": "slick's evaluation reads --tool-key",
    "--eval-reward-key": "slick's evaluation reads --reward-key",
    "--eval-max-context-len": "slick's evaluation uses --eval-max-response-len and the prompt's length",
    "--eval-max-prompt-len": "slick's evaluation uses --rollout-max-prompt-len",
    "--eval-min-new-tokens": "slick's engines take no minimum of new tokens",
    "--eval-top-k": "slick's evaluation samples with top-k off (-1)",
    # training semantics slick does not offer
    "--freeze-params-name-list": "slick trains every parameter, or adapters only with --lora-rank",
    "--only-train-params-name-list": "slick trains every parameter, or adapters only with --lora-rank",
    "--freeze-indexer": "DeepSeek-V3.2's indexer; slick does not train that architecture",
    "--enable-mtp-training": "slick does not train multi-token-prediction layers",
    "--mtp-num-layers": "slick does not train multi-token-prediction layers",
    "--mtp-loss-scaling-factor": "slick does not train multi-token-prediction layers",
    "--use-stateless-adam": "slick's AdamW keeps its moments across steps",
    "--reset-optimizer-states": "slick keeps the optimizer state across rollouts",
    "--ref-update-interval": "slick's reference model stays the one it started with",
    "--ref-ckpt-step": "slick reads the reference from a Hugging Face directory (--ref-load or --hf-checkpoint)",
    "--opd-teacher-ckpt-step": "slick reads the teacher from a Hugging Face directory (--opd-teacher-load)",
    "--release-train": "slick keeps the trainer in memory; --offload-rollout frees the engine instead",
    "--no-offload-train": "slick keeps the trainer in memory already; drop it",
    "--start-rollout-id": "slick resumes at the step --load's checkpoint recorded",
    "--use-unbiased-kl": "slick's KL estimators are --kl-loss-type k1/k2/k3/low_var_kl without a correction",
    "--use-rollout-entropy": "slick computes entropy only for --entropy-coef and its metrics",
    "--get-mismatch-metrics": "slick logs the engine/trainer logprob gap as train/rollout_logprob_gap* "
                              "(and --mismatch-probe-interval)",
    "--no-save-optim": "slick always saves the optimizer state, so a resumed run continues exactly",
    "--moe-router-load-balancing-type": "slick trains MoE models without an auxiliary load-balancing loss",
    "--moe-router-enable-expert-bias": "slick does not update router expert biases",
    "--moe-router-bias-update-rate": "slick does not update router expert biases",
    "--fp8-format": "slick trains in bf16/fp32 (--train-precision)",
    "--fp8-recipe": "slick trains in bf16/fp32 (--train-precision)",
    "--deterministic-mode": "slick seeds every sample (--rollout-seed, --seed); Megatron's deterministic kernels "
                            "have no counterpart",
    "--spec": "a Megatron layer spec module; slick builds the model from --hf-checkpoint",
    # logging and profiling outputs
    "--log-correct-samples": "slick stores every sample (slick rollouts) instead",
    "--log-passrate": "slick logs pass@k of evaluation sets (eval/*/pass@k); training pass rates are in "
                      "rollout/raw_reward",
    "--log-reward-category": "slick stores each sample's reward evidence (slick rollouts SHOW)",
    "--dump-details": "slick stores rollouts in the run directory (--rollout-store-interval)",
    "--memory-recorder": "slick records no memory snapshots; it logs perf/* memory per step",
    "--memory-snapshot-dir": "slick records no memory snapshots; it logs perf/* memory per step",
    "--memory-snapshot-num-steps": "slick records no memory snapshots; it logs perf/* memory per step",
    "--record-memory-history": "slick records no memory snapshots; it logs perf/* memory per step",
    "--profile-target": "slick writes a Perfetto timeline with --trace-file",
    "--check-weight-update-equal": "slick checks synced weights with --weight-check-tol",
    "--ci-test": "slime's own CI self-checks",
    "--ci-disable-kl-checker": "slime's own CI self-checks",
    "--ci-load-grad-norm": "slime's own CI self-checks",
    "--ci-save-grad-norm": "slime's own CI self-checks",
    "--ci-train-rollout-logprob-abs-diff-threshold": "slime's own CI self-checks",
    "--tb-project-name": "slick writes TensorBoard logs under --run-dir",
    "--tb-experiment-name": "slick writes TensorBoard logs under --run-dir",
    "--wandb-always-use-train-step": "slick logs W&B at its step (one rollout and its training)",
    "--disable-wandb-random-suffix": "slick names W&B runs after the run directory",
    "--wandb-dir": _WANDB_ENV.format(env="WANDB_DIR"),
    "--wandb-host": _WANDB_ENV.format(env="WANDB_BASE_URL"),
    "--wandb-key": _WANDB_ENV.format(env="WANDB_API_KEY"),
    "--wandb-mode": _WANDB_ENV.format(env="WANDB_MODE"),
    "--wandb-run-id": _WANDB_ENV.format(env="WANDB_RUN_ID"),
    "--wandb-team": _WANDB_ENV.format(env="WANDB_ENTITY"),
    "--http-proxy": "set HTTP_PROXY / HTTPS_PROXY in the environment",
    "--train-env-vars": "set the variables in slick's own environment",
    "--update-weight-disk-dir": "slick's disk weight sync writes under the run directory",
    "--update-weight-disk-keep-files": "slick's disk weight sync keeps only the newest weights",
    "--update-weight-local-checkpoint-dir": "slick's engines read synced weights from the run directory",
    # Megatron model-shape flags slick does not check against config.json
    **{f: _SHAPE for f in (
        "--rotary-scaling-factor", "--rotary-interleaved", "--use-rope-scaling",
        "--no-position-embedding",
        "--moe-router-dtype", "--moe-layer-freq",
        "--moe-shared-expert-gate", "--moe-router-pre-softmax",
        "--moe-router-num-groups", "--moe-router-group-topk", "--multi-latent-attention",
        "--mscale", "--mscale-all-dim",
        "--use-gated-attention", "--attention-output-gate", "--apply-layernorm-1p", "--post-self-attn-layernorm",
        "--post-mlp-layernorm")},
}


# Megatron model-shape flags checked against --hf-checkpoint's config.json: flag -> (its keys there, in order of
# preference, and the value when the file has none of them (None: the flag must then not be given))
CHECKED: dict[str, tuple[tuple[str, ...], object]] = {
    "--num-experts": (("num_experts", "num_local_experts", "n_routed_experts"), None),
    "--moe-router-topk": (("num_experts_per_tok",), None),
    "--moe-ffn-hidden-size": (("moe_intermediate_size",), None),
    "--moe-shared-expert-intermediate-size": (("shared_expert_intermediate_size",), None),
    "--rotary-percent": (("partial_rotary_factor",), 1.0),
    "--moe-router-score-function": (("scoring_func",), "softmax"),
    "--moe-router-topk-scaling-factor": (("routed_scaling_factor",), None),
    "--q-lora-rank": (("q_lora_rank",), None),
    "--kv-lora-rank": (("kv_lora_rank",), None),
    "--qk-head-dim": (("qk_nope_head_dim",), None),
    "--qk-pos-emb-head-dim": (("qk_rope_head_dim",), None),
    "--v-head-dim": (("v_head_dim",), None),
}
# flags whose one value is what slick does: flag -> (that value, why)
ACCEPTED_VALUES: dict[str, tuple[float, str]] = {
    "--moe-aux-loss-coeff": (0.0, "slick trains MoE models without an auxiliary load-balancing loss"),
}


def _config_json(ns: dict) -> Optional[dict]:
    path = Path(str(ns.get("hf_checkpoint") or "")) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")) if ns.get("hf_checkpoint") else None
    except (OSError, ValueError):
        return None


def _same(given: str, want) -> bool:
    try:
        return float(given) == float(want)
    except (TypeError, ValueError):
        return str(given) == str(want)


def check_shape(ns: dict, problems: list[str]) -> None:
    """The CHECKED flags given in ``ns`` against config.json (logged when they match). Without --hf-checkpoint
    there is nothing to check against (refused); with an unreadable one the run's own checks refuse it."""
    given = {flag: ns.pop(dest(flag)) for flag in CHECKED if dest(flag) in ns}
    if not given:
        return
    cfg = _config_json(ns)
    for flag, values in given.items():
        keys, default = CHECKED[flag]
        if not ns.get("hf_checkpoint"):
            problems.append(f"{flag}: a Megatron model-shape flag, checked against --hf-checkpoint's config.json: "
                            f"give --hf-checkpoint or drop it")
            continue
        if cfg is None:
            continue
        want = next((cfg[k] for k in keys if k in cfg), default)
        if len(values) != 1 or want is None or not _same(values[0], want):
            problems.append(f"{flag} {' '.join(values)} does not match the checkpoint's config.json "
                            f"({' / '.join(keys)}: {want}); slick builds the model from config.json: drop it")
        else:
            log.info("%s %s: matches config.json", flag, values[0])


def dest(flag: str) -> str:
    return PREFIX + flag[2:].replace("-", "_")


def row(flag: str, flag_values: Optional[list] = None):
    """(kind, reason) of ``flag`` in the table: kind "accepted", "checked", "no-op" or "refused"; None when not
    in it. ``flag_values``: the flag's values where they decide (ACCEPTED_VALUES)."""
    if flag in CHECKED:
        return "checked", f"must match --hf-checkpoint's config.json ({' / '.join(CHECKED[flag][0])})"
    if flag in ACCEPTED_VALUES:
        value, why = ACCEPTED_VALUES[flag]
        ok = flag_values is not None and len(flag_values) == 1 and _same(flag_values[0], value)
        return ("accepted", f"{value:g} is what slick does: {why}") if ok else \
            ("refused", f"{why}; only {value:g} is accepted")
    for kind, table in (("accepted", ALWAYS), ("no-op", NO_OP), ("refused", REFUSED)):
        if flag in table:
            return kind, table[flag]
    return None


def add_table_arguments(grp) -> None:
    """One argument per row, taking any values, with a SUPPRESSed default (``grp``: an argparse group)."""
    for flag, (keys, _) in CHECKED.items():
        grp.add_argument(flag, dest=dest(flag), nargs="*", default=argparse.SUPPRESS,
                         help=f"Checked: must match --hf-checkpoint's config.json ({' / '.join(keys)}).")
    for flag, (value, why) in ACCEPTED_VALUES.items():
        grp.add_argument(flag, dest=dest(flag), nargs="*", default=argparse.SUPPRESS,
                         help=f"Accepted as {value:g} ({why}); other values are refused.")
    for kind, table in (("Accepted", ALWAYS), ("No effect (a warning)", NO_OP), ("Refused", REFUSED)):
        for flag, why in table.items():
            grp.add_argument(flag, dest=dest(flag), nargs="*", default=argparse.SUPPRESS,
                             help=f"{kind}: {why}.".replace("%", "%%"))


def resolve_table(ns: dict, problems: list[str]) -> None:
    """Take the table's flags out of ``ns``: log the accepted ones, warn about the no-ops, add one problem line
    per refused flag (and per CHECKED flag that does not match config.json)."""
    check_shape(ns, problems)
    for flag, (value, why) in ACCEPTED_VALUES.items():
        if dest(flag) in ns:
            values = ns.pop(dest(flag))
            if len(values) == 1 and _same(values[0], value):
                log.info("%s %s: accepted (%s)", flag, values[0], why)
            else:
                problems.append(f"{flag} {' '.join(values)}: not supported by slick ({why}; only {value:g} is "
                                f"accepted)")
    for flag, why in ALWAYS.items():
        if ns.pop(dest(flag), None) is not None:
            log.info("%s: accepted (%s)", flag, why)
    for flag, why in NO_OP.items():
        if ns.pop(dest(flag), None) is not None:
            log.warning("%s has no effect in slick: %s", flag, why)
    for flag, why in REFUSED.items():
        if ns.pop(dest(flag), None) is not None:
            problems.append(f"{flag}: not supported by slick ({why})")


def table_rows() -> list[tuple[str, str]]:
    """(flag, what slick does) for the docs."""
    return [(f, f"Checked: must match --hf-checkpoint's config.json ({' / '.join(k)}).") for f, (k, _) in
            CHECKED.items()] + \
        [(f, f"Accepted as {v:g} ({w}); other values are refused.") for f, (v, w) in ACCEPTED_VALUES.items()] + \
        [(f, f"Accepted: {w}.") for f, w in ALWAYS.items()] + \
        [(f, f"No effect (a warning): {w}.") for f, w in NO_OP.items()] + \
        [(f, f"Refused: {w}.") for f, w in REFUSED.items()]

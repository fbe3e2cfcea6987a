"""slime's names and defaults, as data: every flag slick shares with slime.

Read from THUDM/slime ``slime/utils/arguments.py`` (commit 624b824a, 2026-08-21; the code, not its docs)
and, for the Megatron-LM flags slime passes through, NVIDIA/Megatron-LM (commit d98e8a64: the argparse
defaults of ``megatron/training/arguments.py`` and the config dataclasses it builds them from), with
slime's own ``reset_arg`` overrides applied (--lr 1e-6, --micro-batch-size 1, --eval-interval None, ...).

Rows, by what slick does with the flag:
- SAME: (slime flag, slime's default). slick's flag of the same name has this default. A list flag whose
  slime default is None is an empty list in slick (no values either way).
- ALIASES: (slime flag, argv, slick field, value it gives). slime's spelling of a slick flag; ``argv`` must
  parse to the same config as setting the slick field to the value. slime's default noted in the comment
  where it is slick's too (checked in SAME_VIA_ALIAS).
- REFUSED: (slime argv, words the message must contain). slick cannot honour it and says what to use.
- DIFFERS: (slime flag, slime's default, slick's default, why). Kept on purpose; each is listed in
  docs/flags.md "slime users". Megatron model-shape flags are checks in slick (the model comes from
  config.json), so their Megatron defaults do not apply: unset means "not checked".
"""

SAME = [
    # data
    ("--prompt-data", None), ("--metadata-key", "metadata"), ("--tool-key", "tools"),
    ("--apply-chat-template", False), ("--rollout-shuffle", False), ("--rollout-seed", 42),
    ("--num-epoch", None), ("--num-rollout", None), ("--rollout-max-prompt-len", None),
    # rollout
    ("--over-sampling-batch-size", None), ("--rollout-temperature", 1.0), ("--rollout-top-p", 1.0),
    ("--rollout-top-k", -1), ("--rollout-stop", None), ("--rollout-stop-token-ids", None),
    ("--partial-rollout", False), ("--mask-offpolicy-in-partial-rollout", False),
    ("--custom-generate-function-path", None), ("--dynamic-sampling-filter-path", None),
    ("--buffer-filter-path", None), ("--update-weights-interval", 1),
    # algorithm
    ("--advantage-estimator", "grpo"), ("--use-kl-loss", False), ("--kl-loss-coef", 0.0),
    ("--kl-loss-type", "k1"), ("--kl-coef", 0.0), ("--eps-clip", 0.2), ("--eps-clip-high", None),
    ("--eps-clip-c", None), ("--entropy-coef", 0.0), ("--normalize-advantages", False),
    ("--disable-grpo-std-normalization", False), ("--disable-rewards-normalization", False),
    ("--calculate-per-token-loss", False), ("--use-tis", False), ("--tis-clip", 2.0), ("--tis-clip-low", 0.0),
    ("--use-rollout-logprobs", False), ("--gamma", 1.0), ("--lambd", 1.0), ("--use-opsm", False),
    ("--opsm-delta", 1e-4),
    ("--custom-loss-function-path", None), ("--custom-advantage-function-path", None),
    ("--value-clip", 0.2), ("--num-critic-only-steps", 0),
    # reward
    ("--rm-url", None), ("--custom-rm-path", None), ("--group-rm", False), ("--reward-key", None),
    # train (slime's reset_arg values where it resets Megatron's)
    ("--hf-checkpoint", None), ("--ref-load", None), ("--lr", 1e-6), ("--clip-grad", 1.0), ("--seed", 1234),
    ("--adam-beta1", 0.9), ("--adam-beta2", 0.999), ("--global-batch-size", None),
    ("--num-steps-per-rollout", None), ("--use-routing-replay", False),
    # checkpoint
    ("--load", None), ("--save", None), ("--save-interval", None), ("--save-hf", None),
    ("--save-retain-interval", None),
    # eval
    ("--eval-interval", None), ("--eval-prompt-data", None), ("--n-samples-per-eval-prompt", 1),
    ("--eval-temperature", None), ("--eval-max-response-len", None), ("--eval-top-p", None),
    # cluster
    ("--colocate", False), ("--actor-num-nodes", 1), ("--rollout-num-gpus-per-engine", 1),
    ("--use-fault-tolerance", False), ("--rollout-health-check-interval", 30.0),
    ("--rollout-health-check-timeout", 30.0), ("--rollout-health-check-first-wait", 0.0),
    # logging, debug
    ("--use-tensorboard", False), ("--use-wandb", False), ("--wandb-project", None), ("--wandb-group", None),
    ("--save-debug-rollout-data", None), ("--load-debug-rollout-data", None), ("--debug-rollout-only", False),
    ("--debug-train-only", False), ("--save-debug-train-data", None),
    # Megatron flags slime passes through
    ("--recompute-activations", False), ("--recompute-granularity", None), ("--recompute-method", None),
    ("--recompute-num-layers", None), ("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
    ("--context-parallel-size", 1), ("--expert-model-parallel-size", 1), ("--sequence-parallel", False),
    ("--num-layers", None), ("--hidden-size", None), ("--ffn-hidden-size", None), ("--num-attention-heads", None),
    ("--group-query-attention", False), ("--kv-channels", None), ("--vocab-size", None), ("--seq-length", None),
    ("--max-position-embeddings", None), ("--use-rotary-position-embeddings", False), ("--swiglu", False),
    ("--untie-embeddings-and-output-weights", False), ("--disable-bias-linear", False), ("--add-qkv-bias", False),
    ("--qk-layernorm", False),
]

# slime default -> what it means there, where slime writes it differently from slick (same behaviour)
SAME_MEANING = [
    ("--rollout-max-response-len", None, 128, "slime's None sends no max_tokens: SGLang's default max_new_tokens, 128"),
    ("--rollout-function-path", "slime.rollout.sglang_rollout.generate_rollout", None,
     "slime's default names its built-in rollout; unset in slick is slick's built-in rollout"),
    ("--expert-tensor-parallel-size", None, 1, "Megatron's None is the tensor-parallel size, 1"),
]

ALIASES = [
    ("--log-probs-chunk-size", ["--log-probs-chunk-size", "64"], "logprob_chunk_size", 64),
    ("--lr-warmup-iters", ["--lr-warmup-iters", "5"], "lr_warmup_steps", 5),
    ("--use-rollout-routing-replay", ["--use-rollout-routing-replay"], "use_routing_replay", True),
    ("--update-weight-transport", ["--update-weight-transport", "nccl"], "weight_transport", "broadcast"),
    ("--update-weight-transport", ["--update-weight-transport", "disk"], "weight_transport", "disk"),
    ("--update-weight-buffer-size", ["--update-weight-buffer-size", str(256 * 2**20)], "weight_bucket_mb", 256),
    ("--distributed-timeout-minutes", ["--distributed-timeout-minutes", "2"], "dist_timeout", 120.0),
    ("--rollout-external-engine-addrs", ["--rollout-external-engine-addrs", "10.0.0.1:30000", "http://h:30001/"],
     "rollout_urls", ["http://10.0.0.1:30000", "http://h:30001"]),
    ("--rollout-external-engine-addrs", ["--rollout-external-engine-addrs", "10.0.0.1:30000"],
     "rollout_engine", "http"),
    ("--use-dynamic-batch-size", ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096"],
     "max_tokens_per_micro_batch", 4096),
    ("--lr-warmup-fraction", ["--lr-warmup-fraction", "0.1", "--lr-decay-iters", "50"], "lr_warmup_steps", 5),
    ("--optimizer", ["--optimizer", "adam"], "weight_decay", 0.0),            # AdamW, as slick always uses
    ("--balance-data", ["--balance-data"], "max_tokens_per_micro_batch", None),   # slick always balances ranks
    ("--num-data-workers", ["--num-data-workers", "4"], "prompt_data", None),  # no effect: a warning
    ("--attention-backend", ["--attention-backend", "flash"], "prompt_data", None),
]

# slime's defaults of the aliased flags, which are slick's defaults of the fields they set
SAME_VIA_ALIAS = [
    ("--lr-warmup-iters", 0, "lr_warmup_steps", 0),
    ("--update-weight-buffer-size", 512 * 2**20, "weight_bucket_mb", 512),
    ("--distributed-timeout-minutes", 10, "dist_timeout", 600.0),
    ("--rollout-external-engine-addrs", None, "rollout_urls", []),
    ("--use-dynamic-batch-size", False, "max_tokens_per_micro_batch", None),
]

REFUSED = [
    (["--offload"], ["--offload", "--offload-rollout"]),
    (["--offload-train"], ["--offload-train", "--offload-rollout"]),
    (["--use-dynamic-batch-size"], ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "--max-tokens-per-micro-batch"]),
    (["--max-tokens-per-gpu", "512"], ["--max-tokens-per-gpu 512", "--use-dynamic-batch-size",
                                       "--max-tokens-per-micro-batch 512"]),
    (["--log-probs-chunk-size", "-1"], ["--log-probs-chunk-size -1", "--logprob-chunk-size"]),
    (["--update-weight-buffer-size", "1000"], ["--update-weight-buffer-size 1000", "--weight-bucket-mb"]),
    (["--rollout-external-engine-addrs", "nohostport"], ["--rollout-external-engine-addrs", "host:port"]),
    (["--update-weight-transport", "disk", "--weight-transport", "broadcast"],
     ["--update-weight-transport disk", "--weight-transport broadcast", "give one of them"]),
    (["--rollout-external-engine-addrs", "h:1", "--rollout-engine", "local"],
     ["--rollout-external-engine-addrs h:1", "--rollout-engine local"]),
    (["--optimizer", "sgd"], ["--optimizer sgd", "AdamW"]),
    (["--lr-warmup-fraction", "0.1"], ["--lr-warmup-fraction 0.1", "--lr-decay-iters", "--lr-warmup-iters"]),
]

DIFFERS = [
    ("--input-key", "input", "prompt", "slick's prompt files use `prompt`; a missing key stops the run naming it"),
    ("--label-key", None, "label", "slick reads a row's `label` when present (slime's None gives no labels)"),
    ("--rollout-batch-size", "required", 8, "slime requires the flag, so a slime script always gives it"),
    ("--n-samples-per-prompt", 1, 8, "slick's GRPO default groups; 1 gives zero GRPO advantages (refused at start)"),
    ("--rm-type", None, "math", "slime has no default reward (a run needs --rm-type or --custom-rm-path)"),
    ("--micro-batch-size", 1, None, "the same gradients; unset: slick packs micro-batches to a token budget sized "
     "from the model and the memory"),
    ("--offload-rollout", False, None, "unset: slick frees the in-process engine while the trainer steps wherever "
     "a weight sync follows (it costs nothing there)"),
    ("--weight-decay", 0.01, 0.0, "Megatron decays matrices only; slick's AdamW decays every parameter"),
    ("--log-probs-chunk-size", -1, 128, "the same logprobs; slick always chunks (--logprob-chunk-size)"),
    ("--actor-num-gpus-per-node", 8, 0, "slick's default is one trainer in the driver process (CPU-first)"),
    ("--rollout-num-gpus", None, 0, "0: the engine --rollout-engine picks (slime derives it from --colocate)"),
    ("--update-weight-transport", "nccl", "auto", "auto: colocated in process, disk for HTTP engines"),
    ("--rotary-base", 10000, None, "model-shape check: unset = not checked (config.json gives the model)"),
    ("--norm-epsilon", 1e-5, None, "model-shape check: unset = not checked (config.json gives the model)"),
    ("--normalization", "LayerNorm", None, "model-shape check: unset = not checked (config.json gives the model)"),
    ("--position-embedding-type", "learned_absolute", None, "model-shape check: unset = not checked"),
    ("--num-query-groups", 1, None, "model-shape check: unset = not checked (config.json gives the model)"),
    ("--attention-dropout", 0.1, None, "checked against config.json's attention_dropout when given (slime passes 0.0)"),
    ("--hidden-dropout", 0.1, None, "checked against config.json's hidden dropout when given (slime passes 0.0)"),
]

# fields behind DIFFERS rows whose slime flag is spelt differently in slick
DIFFERS_FIELD = {"--log-probs-chunk-size": "logprob_chunk_size", "--update-weight-transport": "weight_transport"}


# every flag slime/utils/arguments.py (624b824a) defines; each must be known to slick's parser: the same flag, a
# spelling, or a row of slick/config/slime_table.py (accepted, no-op or refused by name)
ARGUMENTS_PY = """
--actor-num-gpus-per-node --actor-num-nodes --advantage-estimator --allgather-cp --apply-chat-template
--apply-chat-template-kwargs --async-save --balance-by-flops --balance-data --buffer-filter-path
--calculate-per-token-loss --check-weight-update-equal --ci-disable-kl-checker --ci-load-grad-norm
--ci-save-grad-norm --ci-test --ci-train-rollout-logprob-abs-diff-threshold --clip-grad --colocate
--custom-advantage-function-path --custom-config-path --custom-convert-samples-to-train-data-path
--custom-eval-rollout-log-function-path --custom-generate-function-path --custom-loss-function-path
--custom-megatron-before-log-prob-hook-path --custom-megatron-before-train-step-hook-path
--custom-megatron-init-path --custom-model-provider-path --custom-pg-loss-reducer-function-path
--custom-reward-post-process-path --custom-rm-path --custom-rollout-log-function-path --custom-tis-function-path
--custom-update-weight-post-write-path --data-pad-size-multiplier --data-source-path --debug-rollout-only
--debug-train-only --disable-compute-advantages-and-returns --disable-grpo-std-normalization
--disable-rewards-normalization --disable-rollout-global-dataset --disable-wandb-random-suffix --distributed-backend
--distributed-timeout-minutes --dump-details --dynamic-sampling-filter-path --enable-mtp-training --entropy-coef
--eps-clip --eps-clip-c --eps-clip-high --eval-config --eval-function-path --eval-input-key --eval-interval
--eval-label-key --eval-max-context-len --eval-max-prompt-len --eval-max-response-len --eval-min-new-tokens
--eval-prompt-data --eval-reward-key --eval-temperature --eval-tool-key --eval-top-k --eval-top-p
--fetch-trajectory-retry-times --freeze-indexer --freeze-params-name-list --gamma --get-mismatch-metrics
--global-batch-size --group-rm --hf-checkpoint --http-proxy --input-key --keep-old-actor --kl-coef --kl-loss-coef
--kl-loss-type --label-key --lambd --load --load-debug-rollout-data --load-debug-rollout-data-subsample
--load-forge-rollout-data --log-correct-samples --log-multi-turn --log-passrate --log-probs-chunk-size
--log-probs-max-tokens-per-gpu --log-reward-category --loss-mask-type --loss-type --lr
--mask-offpolicy-in-partial-rollout --max-tokens-per-gpu --megatron-config-path --megatron-deepgemm-forward-layers
--megatron-deepgemm-forward-modules --megatron-deepgemm-moe-forward-layers --megatron-deepgemm-moe-forward-modules
--memory-recorder --memory-snapshot-dir --memory-snapshot-num-steps --metadata-key --micro-batch-size
--min-batch-collection-ratio --model-name --mtp-loss-scaling-factor --mtp-num-layers --multimodal-keys
--n-samples-per-eval-prompt --n-samples-per-prompt --no-save-optim --normalize-advantages --num-critic-only-steps
--num-epoch --num-gpus-per-node --num-rollout --num-steps-per-rollout --offload --offload-rollout --offload-train
--only-train-params-name-list --opd-kl-coef --opd-teacher-ckpt-step --opd-teacher-load --opd-type --opsm-delta
--over-sampling-batch-size --padded-vocab-size --partial-rollout --profile-target --prompt-data --qwen-gdn-backend
--recompute-loss-function --record-memory-history --ref-ckpt-step --ref-load --ref-update-interval --release-train
--reset-optimizer-states --reward-key --rm-type --rm-url --rollout-all-samples-process-path --rollout-batch-size
--rollout-buffer-url --rollout-data-postprocess-path --rollout-data-transport --rollout-external-engine-addrs
--rollout-function-path --rollout-health-check-first-wait --rollout-health-check-interval
--rollout-health-check-timeout --rollout-max-context-len --rollout-max-prompt-len --rollout-max-response-len
--rollout-num-gpus --rollout-num-gpus-per-engine --rollout-sample-filter-path --rollout-sample-hook-path
--rollout-seed --rollout-shuffle --rollout-skip-special-tokens --rollout-stop --rollout-stop-token-ids
--rollout-task-type --rollout-temperature --rollout-top-k --rollout-top-p --save --save-debug-rollout-data
--save-debug-train-data --save-hf --save-interval --seed --skip-eval-before-train --start-rollout-id
--tb-experiment-name --tb-project-name --tis-clip --tis-clip-low --tool-key --train-backend --train-env-vars
--update-weight-buffer-size --update-weight-delta-checksum --update-weight-delta-encoding --update-weight-disk-dir
--update-weight-disk-keep-files --update-weight-local-checkpoint-dir --update-weight-mode --update-weight-transport
--update-weights-interval --use-distributed-post --use-dynamic-batch-size --use-fault-tolerance --use-kl-loss
--use-opd --use-opsm --use-rollout-entropy --use-rollout-logprobs --use-rollout-routing-replay --use-routing-replay
--use-stateless-adam --use-tensorboard --use-tis --use-unbiased-kl --use-wandb --value-clip
--wandb-always-use-train-step --wandb-dir --wandb-group --wandb-host --wandb-key --wandb-mode --wandb-project
--wandb-run-id --wandb-team
""".split()

"""The `train.py` argument lists of two of slime's own example scripts, as data (THUDM/slime at 624b824a):
``scripts/run-qwen3-4B.sh`` (with ``scripts/models/qwen3-4B.sh``) and ``examples/search-r1/run_qwen2.5_3B.sh``
(with ``scripts/models/qwen2.5-3B.sh``), in the order the scripts pass them, commented-out lines left out. Paths
are placeholders that tests/test_slime_scripts.py replaces with tiny local ones: {MODEL} (--hf-checkpoint),
{REF} (a Megatron torch_dist directory), {CKPT} (--load/--save, not there yet), {DATA}, {EVAL}, {PLUGIN}
(the search-r1 plug-in module). ${NUM_GPUS} is 8, the script's fallback.
"""

RUN_QWEN3_4B = [
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "8", "--colocate",
    # MODEL_ARGS (scripts/models/qwen3-4B.sh)
    "--swiglu", "--num-layers", "36", "--hidden-size", "2560", "--ffn-hidden-size", "9728",
    "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
    "--use-rotary-position-embeddings", "--disable-bias-linear", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6",
    "--rotary-base", "1000000", "--vocab-size", "151936", "--kv-channels", "128", "--qk-layernorm",
    # CKPT_ARGS
    "--hf-checkpoint", "{MODEL}", "--ref-load", "{REF}", "--load", "{CKPT}", "--save", "{CKPT}", "--save-interval", "20",
    # ROLLOUT_ARGS
    "--prompt-data", "{DATA}", "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
    "--rollout-shuffle", "--rm-type", "deepscaler", "--num-rollout", "3000", "--rollout-batch-size", "32",
    "--n-samples-per-prompt", "8", "--rollout-max-response-len", "8192", "--rollout-temperature", "1",
    "--global-batch-size", "256", "--balance-data",
    # OPTIMIZER_ARGS
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    # GRPO_ARGS
    "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
    "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    # PERF_ARGS
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
    # EVAL_ARGS
    "--eval-interval", "20", "--eval-prompt-data", "aime", "{EVAL}", "--n-samples-per-eval-prompt", "16",
    "--eval-max-response-len", "16384", "--eval-top-p", "1",
    # SGLANG_ARGS
    "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.7",
    # MISC_ARGS
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
]

SEARCH_R1_QWEN25_3B = [
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "4", "--colocate",
    # MODEL_ARGS (scripts/models/qwen2.5-3B.sh)
    "--swiglu", "--num-layers", "36", "--hidden-size", "2048", "--ffn-hidden-size", "11008",
    "--num-attention-heads", "16", "--use-rotary-position-embeddings", "--disable-bias-linear", "--add-qkv-bias",
    "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--rotary-base", "1000000", "--group-query-attention",
    "--num-query-groups", "2", "--vocab-size", "151936",
    # CKPT_ARGS
    "--hf-checkpoint", "{MODEL}", "--ref-load", "{REF}",
    # ROLLOUT_ARGS
    "--prompt-data", "{DATA}", "--input-key", "prompt", "--label-key", "reward_model", "--apply-chat-template",
    "--rollout-shuffle", "--num-rollout", "3000", "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
    "--rollout-max-response-len", "512", "--rollout-temperature", "1", "--global-batch-size", "256", "--balance-data",
    # OPTIMIZER_ARGS
    "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.01",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98",
    # GRPO_ARGS
    "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.001", "--kl-loss-type", "low_var_kl",
    "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    # PERF_ARGS
    "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
    "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
    # SGLANG_ARGS
    "--rollout-num-gpus-per-engine", "2", "--sglang-mem-fraction-static", "0.7",
    # MISC_ARGS
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--attention-backend", "flash",
    # CUSTOM_ARGS
    "--custom-generate-function-path", "{PLUGIN}.generate", "--custom-rm-path", "{PLUGIN}.reward_func",
]

SCRIPTS = {"run-qwen3-4B": RUN_QWEN3_4B, "search-r1/run_qwen2.5_3B": SEARCH_R1_QWEN25_3B}

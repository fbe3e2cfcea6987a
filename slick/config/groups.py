"""Typed config groups. Every field becomes a ``--flag`` (underscores -> dashes).

Field metadata keys: ``help`` (required), ``choices``, ``nargs``, ``type``, ``flag`` (``None``: no flag
of its own), ``choices_from`` / ``names_from`` ("module:attribute" of a registry whose keys are the
choices / the names listed in the help's ``{names}``; resolved only when a parser, the docs or the
validation need them, so the registries stay the one list and this module stays torch-free).
Field names are unique across groups, so ``Config`` also offers flat access (``cfg.lr``),
the way slime's ``args`` does. This module imports only the standard library.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from slick.config.fields import F
from slick.config.groups_megatron import MegatronCompatConfig


@dataclass
class DataConfig:
    prompt_data: Optional[str] = F(None, "Prompt dataset (.jsonl or .parquet); `path@[start:end]` takes a row slice; "
                                         "`reasoning-gym:TASK[,TASK...][?size=N&seed=S]` generates reasoning-gym's "
                                         "tasks (docs/data.md).")
    input_key: str = F("prompt", "Key of the prompt (a string or a list of chat messages) in each row.")
    label_key: Optional[str] = F("label", "Key of the label handed to the reward function.")
    metadata_key: str = F("metadata", "Key of a per-row metadata dict (e.g. metadata.rm_type overrides --rm-type).")
    tool_key: Optional[str] = F("tools", "Key of a tools list passed to the chat template (a row without it has no "
                                         "tools; slime's default key).")
    apply_chat_template: bool = F(False, "Render prompts with the tokenizer's own chat template.")
    rollout_shuffle: bool = F(False, "Shuffle prompts each epoch (deterministic from --rollout-seed).")
    rollout_seed: int = F(42, "Seed for prompt shuffling and rollout sampling.")
    num_epoch: Optional[int] = F(None, "Number of passes over the prompts (used when --num-rollout is unset).")
    num_rollout: Optional[int] = F(None, "Number of rollout steps to run (default: derived from --num-epoch, else 1 epoch).")
    rollout_max_prompt_len: Optional[int] = F(None, "Drop prompts longer than this many tokens (count reported).")


@dataclass
class RolloutConfig:
    rollout_batch_size: int = F(8, "Prompts per rollout step.")
    n_samples_per_prompt: int = F(8, "Responses sampled per prompt (the group size).")
    over_sampling_batch_size: Optional[int] = F(None, "With a dynamic-sampling filter: prompts submitted per round until the batch is full.")
    rollout_max_response_len: int = F(128, "Maximum new tokens per response.")
    rollout_temperature: float = F(1.0, "Sampling temperature for rollouts.")
    rollout_top_p: float = F(1.0, "Top-p for rollouts.")
    rollout_top_k: int = F(-1, "Top-k for rollouts (-1 disables).")
    rollout_stop: list = F([], "Stop strings.", nargs="+")
    rollout_stop_token_ids: list = F([], "Extra stop token ids (the tokenizer's EOS always stops).", nargs="+", type=int)
    partial_rollout: bool = F(False, "Keep aborted partial responses and continue them next step.")
    rollout_engine: str = F("local", "Engine kind: slick's in-process torch engine (local), `slick serve` or SGLang "
                            "servers over SGLang's API (http), vLLM servers slick launches or finds at --rollout-urls "
                            "(vllm; docs/vllm.md), or SGLang servers slick launches (sglang).",
                            choices=["local", "http", "vllm", "sglang"])
    rollout_urls: list = F([], "Server or router URLs to use instead of launching engines (--rollout-engine http "
                           "or vllm).", nargs="+")
    rollout_engine_python: Optional[str] = F(None, "Python of the environment that has vLLM or SGLang (default: "
                                             ".venv-vllm/bin/python or .venv-sglang/bin/python, made by `make vllm` / "
                                             "`make sglang`).")
    rollout_startup_timeout: float = F(600.0, "Seconds a launched vLLM/SGLang server may take to become healthy "
                                       "before the run fails quoting its log.")
    router: str = F("none", "Start a router in front of the workers.", choices=["none", "sglang"])
    rollout_num_workers: int = F(1, "`slick serve` workers to launch when --rollout-engine http has no --rollout-urls.")
    rollout_concurrency: int = F(256, "Maximum in-flight generate requests.")
    rollout_timeout: float = F(600.0, "Per-request timeout in seconds for HTTP engines.")
    engine_max_running: Optional[int] = F(None, "Most sequences slick's own engine decodes at once (default: "
                                          "automatic, up to 256 (64 in slick train-async), fewer when their KV "
                                          "cache would not fit the memory; vLLM: --vllm-max-num-seqs, SGLang: "
                                          "--sglang-max-running-requests).")
    max_staleness: int = F(0, "Maximum policy-version lag of trained samples (0 = synchronous). slick train: "
                           "the buffer's bound; slick train-async: no token is more than N versions older than "
                           "the trainer at the optimizer step that uses it (docs/async.md).")
    mask_offpolicy_in_partial_rollout: bool = F(False, "Keep the tokens of a continued partial sample that older "
                                                "weights sampled, with loss mask 0 (only its newest version's "
                                                "tokens are trained).")
    async_buffer_size: Optional[int] = F(None, "slick train-async: most rollout batches buffered or in flight "
                                         "ahead of the trainer (default: what --max-staleness allows).")
    async_weight_update: str = F("wait", "slick train-async: how a weight update meets the rollouts in flight: "
                                 "wait for them to finish (one-step-off), continue them under the new weights "
                                 "(pause -> load -> continue), or resubmit them as prompt + tokens so far.",
                                 choices=["wait", "continue", "resubmit"])
    async_timeout: float = F(600.0, "slick train-async: seconds the trainer waits for a batch, and a weight "
                             "update or checkpoint for the rollouts in flight, before the run fails naming it.")
    rollout_num_threads: Optional[int] = F(None, "CPU threads for the in-process engine (default: all cores; "
                                           "with slick train-async on CPU, the cores --train-num-threads leaves).")
    custom_generate_function_path: Optional[str] = F(None, "Dotted path to `async def generate(args, sample, sampling_params, engine) -> Sample`, or slime's `async def generate(args, sample, sampling_params)` (docs/slime.md).")
    rollout_function_path: Optional[str] = F(None, "Dotted path to a function replacing the whole rollout step.")
    dynamic_sampling_filter_path: Optional[str] = F(None, "Dotted path to `filter(args, group) -> bool` (keep group); `slick.rollout.filters.check_reward_nonzero_std` is built in.")
    buffer_filter_path: Optional[str] = F(None, "Dotted path to slime's `filter(args, rollout_id, buffer, num_samples) -> groups`, applied when taking from the buffer (docs/data.md).")
    rollout_sample_filter_path: Optional[str] = F(None, "Dotted path to slime's `filter(args, groups) -> None`, called on each step's kept groups (slime Samples); a sample it marks `remove_sample = True` trains with loss mask 0 (docs/slime.md).")
    rollout_all_samples_process_path: Optional[str] = F(None, "Dotted path to slime's `process(args, all_groups, data_source) -> None`, called after each rollout with every group generated, the ones the dynamic filter dropped too (docs/slime.md).")
    rollout_sample_hook_path: list = F([], "Dotted paths to slime's `hook(args, sample, *, rollout_id=None, evaluation=False) -> Sample | None`, each called on every generated sample before its reward (the flag may be repeated; docs/slime.md).", repeat=True)
    custom_reward_post_process_path: Optional[str] = F(None, "Dotted path to slime's `fn(args, samples) -> (raw_rewards, rewards)`: its rewards replace GRPO's group normalisation and are the advantages (--advantage-estimator grpo or gspo; implies --disable-rewards-normalization; docs/slime.md).")
    custom_convert_samples_to_train_data_path: Optional[str] = F(None, "Dotted path to slime's `fn(args, samples) -> dict` (slime's train-data dict): its `rewards` and `loss_masks` are what the step trains on (implies --disable-rewards-normalization; docs/slime.md).")
    rollout_data_postprocess_path: Optional[str] = F(None, "Dotted path to slime's `fn(args, rollout_id, rollout_data) -> None`, called after the logprobs and advantages with slime's dict of per-sample tensors; its changes to `loss_masks`, `advantages` and `returns` are trained on (docs/slime.md).")
    sglang: dict = F({}, "Engine options: every `--sglang-KEY VALUE` flag lands here as {KEY: VALUE} and goes to the "
                         "engines slick launches (see `--sglang-*` above); servers you start yourself take their own flags.",
                     flag=None)
    vllm: dict = F({}, "vLLM options: every `--vllm-KEY VALUE` flag lands here as {KEY: VALUE} and reaches the vLLM "
                       "servers slick launches as `--KEY VALUE` (see `--vllm-*` above).", flag=None)


@dataclass
class AlgorithmConfig:
    advantage_estimator: str = F("grpo", "Advantage estimator (the names registered in `slick.algo.estimators.ESTIMATORS`).",
                                 choices_from="slick.algo.estimators:ESTIMATORS")
    use_kl_loss: bool = F(False, "Add a KL loss against the reference model.")
    kl_loss_coef: float = F(0.0, "Weight of the KL loss.")
    kl_loss_type: str = F("k1", "KL estimator for the KL loss (slime's default k1).",
                          choices=["k1", "k2", "k3", "low_var_kl"])
    kl_coef: float = F(0.0, "KL penalty folded into the reward (REINFORCE++ style).")
    eps_clip: float = F(0.2, "PPO clip range (lower).")
    eps_clip_high: Optional[float] = F(None, "PPO clip range upper bound (clip-higher); defaults to --eps-clip.")
    eps_clip_c: Optional[float] = F(None, "Dual-clip constant c (> 1) for negative advantages.")
    entropy_coef: float = F(0.0, "Entropy bonus coefficient.")
    normalize_advantages: bool = F(False, "Whiten advantages over the batch.")
    disable_grpo_std_normalization: bool = F(False, "GRPO without dividing by the group std (Dr.GRPO).")
    disable_rewards_normalization: bool = F(False, "Use raw rewards as the advantage signal (no group baseline).")
    allow_zero_advantages: bool = F(False, "Train even when every advantage is 0 (a group-relative estimator with "
                                           "--n-samples-per-prompt 1), which is otherwise refused at start-up.")
    turn_gamma: float = F(1.0, "Per-turn rewards (a reward function returning one reward per policy turn): the "
                               "discount of the per-turn returns, G_t = r_t + gamma * G_{t+1} (docs/agents.md).")
    turn_advantage_norm: str = F("episode", "Per-turn rewards: GRPO normalisation of each turn's return against "
                                            "the group's episode returns (episode) or against the group's returns "
                                            "at the same turn position (turn).", choices=["episode", "turn"])
    calculate_per_token_loss: bool = F(False, "Mean over all tokens instead of mean of per-sample token means.")
    custom_pg_loss_reducer_function_path: Optional[str] = F(None, "Dotted path to slime's `fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> reducer`; `reducer(pg_loss)` reduces the policy loss of each micro-batch (docs/slime.md).")
    custom_tis_function_path: Optional[str] = F(None, "Dotted path to slime's `fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, **kwargs) -> (pg_loss, loss_masks, metrics)`, replacing --use-tis's weights (with --use-tis; docs/slime.md).")
    use_tis: bool = F(False, "Truncated importance sampling against rollout logprobs.")
    tis_clip: float = F(2.0, "Upper clamp of TIS weights.")
    tis_clip_low: float = F(0.0, "Lower clamp of TIS weights.")
    tis_level: str = F("token", "TIS ratio per token, per sequence (product over its tokens) or geometric (per-token "
                       "geometric mean over the sequence): docs/algorithms.md, rollout correction.",
                       choices=["token", "sequence", "geometric"])
    use_mis: bool = F(False, "Masked importance sampling: tokens (or sequences, --mis-level) whose trainer/rollout "
                      "ratio falls outside [--mis-low, --mis-high] leave the loss.")
    mis_level: str = F("token", "MIS ratio level (as --tis-level).", choices=["token", "sequence", "geometric"])
    mis_low: float = F(0.5, "Lower bound of the MIS ratio.")
    mis_high: float = F(2.0, "Upper bound of the MIS ratio.")
    use_rollout_logprobs: bool = F(False, "Use the engine's logprobs as old logprobs (skip the trainer's recompute).")
    policy_loss: str = F("vanilla", "Policy-gradient objective (verl's names; docs/algorithms.md, Policy losses): PPO's "
                         "clipped loss (vanilla; GSPO's with --advantage-estimator gspo), gspo, cispo, sapo, gpg, "
                         "gmpo (verl's geo_mean), clip_cov or kl_cov.", choices_from="slick.algo.objectives:POLICY_LOSSES")
    cispo_eps_low: Optional[float] = F(None, "CISPO: the IS weight is clipped below at 1 - this (default --eps-clip).")
    cispo_eps_high: Optional[float] = F(None, "CISPO: the IS weight is clipped above at 1 + this (default "
                                        "--eps-clip-high, else --eps-clip).")
    sapo_tau_pos: float = F(1.0, "SAPO: temperature of the soft gate where the advantage is positive (verl's tau_pos).")
    sapo_tau_neg: float = F(1.05, "SAPO: temperature of the soft gate where the advantage is not positive "
                            "(verl's tau_neg).")
    clip_cov_ratio: float = F(0.0002, "Clip-Cov: fraction of a micro-batch's loss tokens whose gradient is cut.")
    clip_cov_lb: float = F(1.0, "Clip-Cov: a token is a candidate when its covariance is above this ...")
    clip_cov_ub: float = F(5.0, "Clip-Cov: ... and below this.")
    kl_cov_ratio: float = F(0.0002, "KL-Cov: fraction of a micro-batch's loss tokens (the highest covariance) that "
                            "get the KL penalty.")
    ppo_kl_coef: float = F(0.1, "KL-Cov: weight of |logprob - old logprob| on those tokens (verl's ppo_kl_coef).")
    use_opsm: bool = F(False, "Off-policy sequence masking (slime): a sequence with negative advantage whose KL to "
                       "the old policy exceeds --opsm-delta leaves the policy loss.")
    opsm_delta: float = F(1e-4, "OPSM: the sequence-level KL threshold.")
    high_entropy_token_ratio: float = F(1.0, "Only this fraction of each micro-batch's loss tokens, those of highest "
                                        "entropy, carry the policy gradient (the 80/20 paper uses 0.2; 1: all).")
    overlong_buffer_len: Optional[int] = F(None, "DAPO soft overlong penalty: a response longer than "
                                           "--rollout-max-response-len minus this many tokens loses reward linearly, "
                                           "up to --overlong-penalty-factor at the maximum length.")
    overlong_penalty_factor: float = F(1.0, "DAPO: the penalty at the maximum length (with --overlong-buffer-len).")
    mask_truncated: bool = F(False, "Truncated samples (cut at the length limit) leave the loss; they still count in "
                             "their group's advantages (TRL's mask_truncated_completions, DAPO's overlong filter).")
    gamma: float = F(1.0, "Discount factor (PPO / REINFORCE++).")
    lambd: float = F(1.0, "GAE lambda (PPO).")
    custom_loss_function_path: Optional[str] = F(
        None, "Dotted path to a loss fn(cfg, inputs: slick.algo.LossInputs) -> (loss, metrics) replacing the policy "
        "loss (docs/algorithms.md).")
    custom_advantage_function_path: Optional[str] = F(
        None, "Dotted path to an advantage fn(inputs: slick.algo.AdvantageInputs) -> AdvantageOutputs replacing the "
        "estimator (docs/algorithms.md).")


@dataclass
class RewardConfig:
    rm_type: Optional[str] = F("math", "Reward type: {names}, or boxed_<type> to score the last \\boxed{{...}} with a "
                                       "rule type (the names registered in `slick.reward.registry`).",
                               names_from="slick.reward.registry:known_types")
    rm_url: Optional[str] = F(None, "URL of a remote reward model (--rm-type remote_rm).")
    custom_rm_path: Optional[str] = F(None, "Dotted path to `[async] def rm(args, sample) -> float | dict` (or of (args, samples) with --group-rm).")
    group_rm: bool = F(False, "Call the reward function once per group.")
    reward_key: Optional[str] = F(None, "Field of a dict reward used as the scalar reward (unset: its `reward` entry).")
    rm_timeout: float = F(30.0, "Seconds before one reward call counts as failed.")
    rm_max_retries: int = F(3, "Retries (with backoff) for remote reward calls.")
    rm_concurrency: Optional[int] = F(None, "Maximum reward computations in flight (unset: --rollout-concurrency "
                                            "for --rm-type remote_rm, whose calls wait on a server; 16 for reward "
                                            "functions, which run on that many worker threads).")
    rm_failure_reward: float = F(0.0, "Reward given to a sample whose reward function raised, timed out, or whose scalar reward is NaN/inf.")


@dataclass
class SandboxConfig:
    sandbox_workers: Optional[int] = F(None, "Sandboxed programs run at once (--rm-type code, @tool(sandbox=True)); "
                                             "default: one per core (docs/sandbox.md).")
    sandbox_timeout: float = F(10.0, "Wall-clock seconds one sandboxed program may run; then its sandbox is killed "
                                     "(verdict time_limit).")
    sandbox_cpu_seconds: int = F(5, "CPU seconds (RLIMIT_CPU) of each process in the sandbox.")
    sandbox_memory_mb: int = F(1024, "Memory of one sandboxed program, in MiB: the address space (RLIMIT_AS) of "
                                     "each process and, where the host allows a memory cgroup, all its processes "
                                     "and in-memory files together (docs/sandbox.md).")
    sandbox_max_processes: int = F(32, "Processes and threads a sandboxed program may have (RLIMIT_NPROC).")
    sandbox_file_size_mb: int = F(16, "Largest file a sandboxed program may write (RLIMIT_FSIZE), in MiB.")
    sandbox_open_files: int = F(64, "Open files of each process in the sandbox (RLIMIT_NOFILE).")
    sandbox_output_kb: int = F(1024, "stdout and stderr are each kept up to this many KiB; past it the sandbox is "
                                     "killed (verdict output_limit).")
    sandbox_tmp_mb: int = F(64, "Size of the sandbox's fresh in-memory /tmp (its working directory; /dev/shm "
                                "links to it), in MiB: the only place a sandboxed program can write.")
    sandbox_python: Optional[str] = F(None, "Interpreter inside the sandbox (default: /usr/bin/python3, else the "
                                            "one running slick).")
    code_reward_mode: str = F("fraction", "--rm-type code: reward = fraction of tests passed, or 1.0 only when "
                                          "all pass.", choices=["fraction", "all"])
    code_block: str = F("last", "--rm-type code: which fenced code block of the response is the program (none: "
                                "the whole response).", choices=["last", "first", "none"])


@dataclass
class TrainConfig:
    hf_checkpoint: Optional[str] = F(None, "Local Hugging Face model directory for the policy (and reference); "
                                           "required. Checked before anything loads (config.json, weights, "
                                           "tokenizer); slick never downloads a model.")
    ref_load: Optional[str] = F(None, "Local HF directory of the reference model (default: --hf-checkpoint); checked "
                                      "like --hf-checkpoint, without the tokenizer.")
    lr: float = F(1e-6, "Learning rate (AdamW).")
    lr_warmup_steps: int = F(0, "Linear warm-up steps.")
    adam_beta1: float = F(0.9, "AdamW beta1.")
    adam_beta2: float = F(0.999, "AdamW beta2.")
    weight_decay: float = F(0.0, "AdamW weight decay of the matrices (biases and norm weights do not decay, as in "
                                 "Megatron and Hugging Face's Trainer).")
    exp_avg_dtype: Optional[str] = F(None, "AdamW first moment (exp_avg) storage: fp32, or bf16 with stochastic "
                                     "rounding (2 bytes less per parameter; docs/training.md). Unset: bf16 when a CPU "
                                     "trains in bf16; otherwise fp32, or bf16 when memory is short (chosen and logged "
                                     "at start-up).", choices=["fp32", "bf16"])
    exp_avg_sq_dtype: Optional[str] = F(None, "AdamW second moment (exp_avg_sq) storage: fp32, or bf16 with "
                                        "stochastic rounding (2 bytes less per parameter). Unset: as --exp-avg-dtype's "
                                        "automatic choice.", choices=["fp32", "bf16"])
    clip_grad: float = F(1.0, "Gradient-norm clip (0 disables).")
    global_batch_size: Optional[int] = F(None, "Samples per optimizer step (derived when unset).")
    num_steps_per_rollout: Optional[int] = F(None, "Optimizer steps per rollout (derived when unset).")
    micro_batch_size: Optional[int] = F(None, "Samples per micro-batch before packing. Unset, with "
                                        "--max-tokens-per-micro-batch unset too: micro-batches packed to a token "
                                        "budget sized from the model, the sequence lengths and the memory "
                                        "available, logged at start-up (docs/training.md, Automatic choices).")
    max_tokens_per_micro_batch: Optional[int] = F(None, "Pack micro-batches up to this many tokens instead of a sample "
                                                  "count, counted in the packed row (a prompt its samples share "
                                                  "counts once; slime: --use-dynamic-batch-size --max-tokens-per-gpu N; "
                                                  "unset: sized automatically unless --micro-batch-size is given).")
    seed: int = F(1234, "Global random seed (python, numpy, torch), set once when the run starts.")
    dtype: str = F("auto", "Compute dtype for trainer and local engine: bf16 where the CPU/GPU supports it, else fp32.", choices=["auto", "bf16", "fp32"])
    train_precision: str = F("autocast", "bf16 training scheme: fp32 weights under torch.autocast, fp32 weight "
                             "grads (autocast; learns faster per step here), or bf16 weights and grads with "
                             "fp32 master copies in AdamW (bf16; less memory). Ignored with --dtype fp32.",
                             choices=["autocast", "bf16"])
    gradient_checkpointing: Optional[bool] = F(None, "Recompute each decoder layer's forward in backward, keeping only "
                                               "the layer inputs (the largest saving, at one more forward). Unset: off, "
                                               "unless memory is short even with bf16 AdamW moments and MLP "
                                               "recomputation (chosen and logged at start-up).")
    disable_prompt_sharing: bool = F(False, "Give every sample its own copy of the prompt in packed micro-batches "
                                     "(default: the n samples of a prompt share one copy via a tree attention mask).")
    train_zero_advantage_samples: bool = F(False, "Run the forward and backward of samples whose advantages are "
                                           "all zero too (default: left out when the policy loss has no entropy or KL "
                                           "term, since their gradient is exactly zero: a group whose samples all got "
                                           "the same reward; the update is the same, the clip fraction, KL and "
                                           "entropy metrics then describe the samples trained on; docs/training.md).")
    recompute_mlp: Optional[bool] = F(None, "Fused decoder layers: recompute each MLP's gate/up projection in "
                                      "backward instead of keeping it (~45% less activation memory, ~15% more trainer "
                                      "FLOPs; the same values; docs/training.md). Unset: on for training on a CPU; on a "
                                      "GPU only when memory is short even with bf16 AdamW moments (chosen and logged "
                                      "at start-up).")
    disable_fused_layers: bool = F(False, "Run the HF decoder layers' own forward in training instead of slick's fused "
                                   "attention and MLP nodes (~3x the activation memory; docs/training.md).")
    use_routing_replay: bool = F(False, "Mixture-of-experts models: the trainer's forward routes every token through "
                                 "the experts the rollout engine chose for it (recorded by the in-process engine or "
                                 "returned by slick serve over HTTP, carried on the sample), with the router's own gate "
                                 "weights (R3; docs/moe.md). slime's --use-rollout-routing-replay is the same flag.")
    logprob_chunk_size: int = F(128, "Tokens per chunk when computing logprobs/entropy from logits "
                                "(the lm head's logits exist one chunk at a time).")
    device: str = F("auto", "Torch device for trainer and local engine (auto: cuda when present).")
    train_num_threads: Optional[int] = F(None, "CPU threads for training (default: all cores; with slick "
                                         "train-async on CPU, half of them, rounded up).")


@dataclass
class CheckpointConfig:
    load: Optional[str] = F(None, "Resume from this checkpoint directory (the latest step inside it).")
    save: Optional[str] = F(None, "Save checkpoints into this directory: new, empty, or holding slick checkpoints (a resume); anything else, or one overlapping --save-hf, the run directory or an input model, is refused at start.")
    save_interval: Optional[int] = F(None, "Save every N rollout steps (and at the end).")
    save_hf: Optional[str] = F(None, "Write a Hugging Face model directory here: with every checkpoint when --save is set, otherwise once after the last step. New, empty or an earlier slick export; anything else is refused at start.")
    keep_checkpoints: Optional[int] = F(None, "Keep only the newest K checkpoints in --save (older ones are deleted after each save; default: keep all, or the newest one with --save-retain-interval).")
    save_retain_interval: Optional[int] = F(None, "Also keep every checkpoint whose step is a multiple of N; the others except the newest (--keep-checkpoints K: the newest K) are deleted (Megatron's flag).")


@dataclass
class EvalConfig:
    eval_interval: Optional[int] = F(None, "Evaluate every N steps (and before the first and after the last).")
    eval_prompt_data: list = F([], "Eval datasets as NAME PATH pairs.", nargs="+")
    eval_function_path: Optional[str] = F(None, "Dotted path to slime's `fn(args, rollout_id, data_source, evaluation=True) -> RolloutFnEvalOutput | dict`, run instead of slick's evaluation (docs/slime.md).")
    n_samples_per_eval_prompt: int = F(1, "Samples per eval prompt (pass@k uses k = this).")
    eval_temperature: Optional[float] = F(None, "Eval sampling temperature (default: --rollout-temperature).")
    eval_max_response_len: Optional[int] = F(None, "Eval max new tokens (default: --rollout-max-response-len).")
    eval_top_p: Optional[float] = F(None, "Eval top-p (default: --rollout-top-p).")


@dataclass
class ClusterConfig:
    ray_address: Optional[str] = F(None, "Ray cluster to run on: HOST:PORT of its GCS (what `ray start --head` "
                                         "prints), ray://HOST:PORT, or `auto` (the cluster this machine has "
                                         "joined). Unset: the RAY_ADDRESS environment variable when set (`ray job "
                                         "submit` sets it); without either, slick starts a local Ray cluster itself "
                                         "when the layout needs more than one process, and stops it at the end. "
                                         "docs/cluster.md.")
    colocate: bool = F(False, "Trainer ranks and rollout engines share slots: without Ray the in-process "
                              "engine (always colocated); on Ray one engine inside each trainer rank's actor "
                              "(--rollout-num-gpus 0 or equal to the trainer ranks), weights handed over in "
                              "process. Refused with --rollout-urls (those engines run in processes of their own).")
    actor_num_nodes: int = F(1, "Training nodes. Trainer ranks = --actor-num-nodes x --actor-num-gpus-per-node, "
                                "data-parallel (FSDP2 over gloo on CPU, NCCL on GPU), one Ray actor each when more "
                                "than one. Above 1 needs --actor-num-gpus-per-node >= 1.")
    actor_num_gpus_per_node: int = F(0, "Trainer ranks per node. 0: one trainer in the driver process on the device "
                                        "--device picks. On a machine without GPUs each GPU is one CPU slot "
                                        "(`--actor-num-gpus-per-node 2` = two trainer ranks, with the cores split "
                                        "between all processes: docs/cluster.md).")
    rollout_num_gpus: int = F(0, "GPUs (CPU slots without GPUs) for slick-managed rollout engines: engines = "
                                 "--rollout-num-gpus / --rollout-num-gpus-per-engine, each a `slick serve` server in "
                                 "a Ray actor, on slots of their own after the trainer's (with --colocate: inside "
                                 "the trainer ranks' actors). 0: the engine --rollout-engine picks.")
    rollout_num_gpus_per_engine: int = F(1, "GPUs per slick-managed rollout engine. Only 1: slick's engine has no "
                                            "tensor parallelism; for tensor-parallel engines start SGLang servers "
                                            "with --tp N yourself and pass --rollout-engine http --rollout-urls.")
    weight_transport: str = F("auto", "How new weights reach the engines: disk (a safetensors directory + version "
                                      "marker; what HTTP engines load), broadcast (a gloo/NCCL group of trainer rank 0 "
                                      "and the engines), colocated (tensors in the same process or shared memory, no "
                                      "copy through disk). auto: colocated for the in-process engine and --colocate, "
                                      "disk otherwise. docs/weights.md.",
                              choices=["auto", "disk", "broadcast", "colocated"])
    weight_bucket_mb: int = F(512, "Largest bucket of a weight update, in MiB: disk writes safetensors shards of at "
                                   "most this size, broadcast sends one bucket per /update_weights_from_distributed "
                                   "round (colocated hands every tensor over at once).")
    dist_timeout: float = F(600.0, "Seconds any collective, Ray remote call or weight broadcast may take before the "
                                   "run fails naming the rank or actor that did not answer.")
    ray_start_timeout: float = F(120.0, "Seconds to wait for the Ray cluster (joining --ray-address is retried "
                                        "until then), the placement group's bundles and the actors to start; past "
                                        "it the run fails naming what was asked and what the cluster has.")
    use_fault_tolerance: bool = F(False, "Engine fault tolerance (docs/engine.md, Engine faults): every engine is "
                                         "health-checked; one that dies or hangs leaves the router at once, its requests "
                                         "go on on the others from the tokens already received, and a replacement is "
                                         "started, loaded with the current weights and version, and only then rejoins. "
                                         "Without it a dead engine ends the run within seconds, naming it.")
    rollout_health_check_interval: float = F(30.0, "Seconds between two /health_generate checks of every engine "
                                                   "(--use-fault-tolerance); a launched worker's process is watched "
                                                   "every 0.2 s with or without the flag.")
    rollout_health_check_timeout: float = F(30.0, "Seconds an engine may take to answer /health_generate (a one-token "
                                                  "generation) before it counts as hung and is replaced.")
    rollout_health_check_first_wait: float = F(0.0, "Seconds after the engines start before the first "
                                                    "/health_generate check (time for compilation or warm-up).")
    update_weights_interval: int = F(1, "Push weights to the engines every N steps (raises --max-staleness to the "
                                        "lag this creates).")
    offload_rollout: Optional[bool] = F(None, "slick train with the in-process engine: free the engine's KV cache "
                                              "and packed weight copies while the trainer steps (the weight sync "
                                              "after the step sends them back): a lower peak for the same speed "
                                              "(docs/training.md, Where the memory goes). Unset: on wherever it "
                                              "applies (logged at start-up); --no-offload-rollout keeps the memory. "
                                              "Refused where no sync follows a step or the engines run elsewhere.")


@dataclass
class LoggingConfig:
    run_dir: Optional[str] = F(None, "Run directory for metrics.jsonl, config.yaml and plots (default runs/<time>).")
    use_tensorboard: bool = F(False, "Also write TensorBoard event files into the run directory.")
    use_wandb: bool = F(False, "Also log to Weights & Biases (WANDB_MODE=offline works without a network).")
    wandb_project: Optional[str] = F(None, "wandb project.")
    wandb_group: Optional[str] = F(None, "wandb group.")
    no_progress: bool = F(False, "Disable the progress bar.")
    prometheus_port: Optional[int] = F(None, "Serve the run's Prometheus /metrics on this port (0: a free port, "
                                             "logged and written to RUN_DIR/prometheus_targets.json); unset: off.")
    prometheus_host: str = F("127.0.0.1", "Address the --prometheus-port endpoint binds (default loopback only).")
    mismatch_probe_samples: int = F(2, "Samples per step whose every response position the engine and the trainer "
                                    "score over the whole vocabulary (top-k + the rest): train/mismatch_kl_*. Engines "
                                    "that return top-k prompt logprobs (slick's, SGLang, vLLM); 0: off.")
    trace_file: Optional[str] = F(None, "Write the run's timeline as a Chrome/Perfetto trace (JSON trace events) to "
                                        "this path: per sample generate/reward/tool spans, per group in flight and "
                                        "buffered, engine busy, trainer steps (open in ui.perfetto.dev; `slick "
                                        "inspect` links it). Relative paths are under the run directory.")
    mismatch_probe_top_k: int = F(20, "Top-k logprobs the engine returns per position for the mismatch probe.")
    mismatch_probe_interval: int = F(10, "Rollout steps between mismatch probes: the first step's and every Nth "
                                         "after it (1: every step; each probe costs a trainer and an engine forward "
                                         "of --mismatch-probe-samples samples, perf/mismatch_probe_time).")


@dataclass
class DebugConfig:
    save_debug_rollout_data: Optional[str] = F(None, "Save each step's rollout samples under this directory.")
    load_debug_rollout_data: Optional[str] = F(None, "Train from rollouts saved by --save-debug-rollout-data instead of generating.")
    debug_rollout_only: bool = F(False, "Generate rollouts but skip training.")
    debug_train_only: bool = F(False, "Skip weight sync to engines (train only; use with --load-debug-rollout-data).")
    save_debug_train_data: Optional[str] = F(None, "Write DIR/train_N.jsonl per step with advantages and logprobs per sample.")


@dataclass
class AgentConfig:
    max_turns: int = F(1, "Most policy turns per sample. Above 1 the built-in multi-turn rollout runs: each turn's "
                          "tool calls (--tool-path) or environment step (--environment-path) answer with tokens "
                          "of loss mask 0 and the policy goes on (docs/agents.md). A --custom-generate-function-path "
                          "may read it from args instead.")
    max_tokens_per_turn: Optional[int] = F(None, "Multi-turn: most new tokens the policy samples in one turn "
                                                 "(default: what is left of --rollout-max-response-len, which "
                                                 "counts tool and environment tokens too).")
    tool_path: Optional[str] = F(None, "Multi-turn: tool implementations: a module whose public functions are the "
                                       "tools, or `module:ATTR` holding a list or dict of functions (sync or async; "
                                       "docs/agents.md).")
    tool_parser: str = F("hermes", "Multi-turn: tool-call parser: `hermes` (<tool_call>{\"name\": ..., "
                                   "\"arguments\": {...}}</tool_call>) or a dotted path to `fn(text) -> calls`.")
    tool_timeout: float = F(10.0, "Multi-turn: seconds one tool call may run before it answers with an error.")
    tool_max_output_chars: int = F(4000, "Multi-turn: a tool's output is cut to this many characters.")
    environment_path: Optional[str] = F(None, "Multi-turn: dotted path to an environment factory "
                                              "`make(args, sample)` whose result has `reset(sample)` and "
                                              "`step(policy_message) -> (observation, reward, done)` (docs/agents.md).")
    environment: Optional[str] = F(None, "Multi-turn: an environment users already have, `verifiers:ENV_ID` (a "
                                         "verifiers 0.4.0 taskset/env importable by id) or `textarena:GAME` (a "
                                         "single-player TextArena game); its prompts come from --prompt-data "
                                         "KIND:ID[?size=N&seed=S] (docs/agents.md, Environments users bring).")
    mcp_server: Optional[str] = F(None, "Multi-turn: the command line of an MCP server speaking stdio (`python "
                                        "server.py`); slick starts it once, and its tools (names and JSON schemas "
                                        "from the server) join the rollout's tools; each call is bounded by "
                                        "--tool-timeout (docs/agents.md, MCP tools).")
    mcp_url: Optional[str] = F(None, "Multi-turn: the URL of an MCP server speaking streamable HTTP "
                                     "(`http://127.0.0.1:8000/mcp`), instead of --mcp-server; loopback only unless "
                                     "--mcp-allow-remote.")
    mcp_allow_remote: bool = F(False, "Allow an --mcp-url whose host is not loopback (its tools then run on "
                                      "another machine, which sees every call's arguments).")
    mcp_env: list = F([], "Names of the driver's environment variables the --mcp-server process gets besides the "
                          "MCP SDK's safe defaults (HOME, PATH, ...); it gets no others.", nargs="+")
    mcp_startup_timeout: float = F(60.0, "Seconds the MCP server may take to start and list its tools (at the "
                                         "run's start, and when a crashed server is started again).")
    agent_function_path: Optional[str] = F(None, "Black-box agent: dotted path to `async def run(args, sample, "
                                                 "base_url) -> None | float | dict`, which calls the OpenAI-compatible "
                                                 "endpoint at base_url; every completion is recorded and trained "
                                                 "(docs/agents.md).")
    agent_timeout: float = F(600.0, "Black-box agent: seconds one agent session may run; past it the session is "
                                    "cancelled and its sample fails with --rm-failure-reward.")
    agent_max_calls: int = F(64, "Black-box agent: most completion requests in one session; further ones answer "
                                 "HTTP 429.")


@dataclass
class CriticConfig:
    critic_load: Optional[str] = F(None, "PPO critic: initialise the value model from this directory: a Hugging Face "
                                         "model (its backbone, with a new zero-initialised value head) or a critic "
                                         "slick saved (a checkpoint step directory or its `critic/`). Default: "
                                         "--hf-checkpoint. Only with --advantage-estimator ppo.")
    critic_lr: Optional[float] = F(None, "PPO critic: AdamW learning rate of the value model (default: --lr).")
    critic_lr_warmup_iters: int = F(0, "PPO critic: linear warm-up of --critic-lr over this many critic optimizer "
                                       "steps.")
    critic_num_steps_per_rollout: Optional[int] = F(None, "PPO critic: critic optimizer steps per rollout (default: "
                                                          "--num-steps-per-rollout); must divide the rollout's samples.")
    value_clip: float = F(0.2, "PPO critic: clip range of the value loss: new values are kept within +-value_clip of "
                               "the values the rollout was scored with, and the larger of the clipped and unclipped "
                               "squared errors is used.")
    num_critic_only_steps: int = F(0, "PPO critic: the first N rollout steps train the critic only: the actor takes "
                                      "no optimizer step and no weights are synced to the engines.")


@dataclass
class RolloutStoreConfig:
    no_rollout_store: bool = F(False, "Do not write the rollout store (RUN_DIR/rollouts/step_N.parquet: every trained "
                                      "sample with tokens, rewards, evidence, versions; docs/observability.md).")
    rollout_store_interval: int = F(1, "Store the samples of every Nth step (1-based step numbers divisible by N); "
                                       "0 turns the store off like --no-rollout-store.")
    rollout_store_max_mb: float = F(512.0, "Size bound of the rollout store in MiB: past it the oldest step files "
                                           "are deleted (a rolling window of the latest steps); 0 = unbounded.")


@dataclass
class LoraConfig:
    lora_rank: int = F(0, "LoRA rank: train low-rank adapters (PEFT) on a frozen base instead of every weight; 0 = full "
                          "fine-tuning (docs/lora.md).")
    lora_alpha: Optional[float] = F(None, "LoRA alpha: adapters are scaled by alpha / rank (default: 2 x --lora-rank).")
    lora_dropout: Optional[float] = F(None, "LoRA dropout on the adapters' input during training steps (default 0; "
                                            "logprobs for the loss's old, reference and sync checks run without it).")
    lora_target_modules: Optional[str] = F(None, "Comma-separated linear layer names to adapt (a name matches a layer "
                                                 "whose full name ends with it, e.g. q_proj,v_proj), or all-linear "
                                                 "(every linear layer but the output layer; the default).")
    lora_load: Optional[str] = F(None, "Start from this PEFT LoRA adapter directory (adapter_config.json): its rank, "
                                       "alpha and targets are used, on --hf-checkpoint as the base.")
    weight_check_tol: Optional[float] = F(None, "After every weight sync, check that each engine reports the trainer's "
                                                "version and that a probe's logprobs match the trainer's within this "
                                                "bound; a failed check stops the run. On by default with LoRA (1e-3 in "
                                                "fp32, 0.5 in bf16); off otherwise unless set (docs/lora.md).")


@dataclass
class SftDistillConfig:
    loss_type: str = F("policy_loss", "Training loss: the RL policy objective (policy_loss), supervised fine-tuning on "
                                      "the assistant tokens of chats (sft_loss: no engine starts; docs/sft.md), or "
                                      "--custom-loss-function-path (custom_loss).",
                       choices=["policy_loss", "sft_loss", "custom_loss"])
    disable_compute_advantages_and_returns: bool = F(False, "Train without advantages or returns (slime's SFT flag): "
                                                            "implied by --loss-type sft_loss, refused with "
                                                            "policy_loss (whose gradient is the advantage).")
    completion_key: str = F("completion", "SFT: key of the completion in a prompt/completion row (the prompt is "
                                          "--input-key; docs/sft.md).")
    lr_decay_style: str = F("constant", "Learning-rate schedule after the warm-up: constant, or linear / cosine "
                                        "decay to --min-lr over --lr-decay-iters optimizer steps.",
                            choices=["constant", "linear", "cosine"])
    lr_decay_iters: Optional[int] = F(None, "Optimizer steps of the --lr-decay-style decay, warm-up included "
                                            "(needed by linear and cosine).")
    min_lr: float = F(0.0, "Learning rate at the end of a linear or cosine decay.")
    use_opd: bool = F(False, "On-policy distillation: the teacher (--opd-teacher-load) scores the tokens the student "
                             "sampled and --opd-kl-coef x (teacher - student logprob) joins every token's advantage "
                             "(docs/distillation.md).")
    opd_type: str = F("trainer", "OPD: where the teacher runs: a frozen forward in the trainer process (trainer; "
                                 "slime's megatron), or an inference engine that is never updated and scores "
                                 "prompt + response by its prompt logprobs (engine; slime's sglang): the server at "
                                 "--opd-teacher-url, else an in-process engine on --opd-teacher-load.",
                      choices=["trainer", "engine", "megatron", "sglang"])
    opd_kl_coef: float = F(1.0, "OPD: weight of the per-token teacher - student logprob in the advantage.")
    opd_teacher_load: Optional[str] = F(None, "OPD: the teacher's Hugging Face model directory (same tokenizer as "
                                              "--hf-checkpoint).")
    opd_teacher_url: Optional[str] = F(None, "OPD with --opd-type engine: the URL of a running teacher server "
                                             "(slick serve, SGLang, sglang-router or vLLM; slime gives it as "
                                             "--rm-url URL/generate) instead of an in-process engine.")
    opd_only: bool = F(False, "OPD: pure distillation: the advantage is the OPD term alone (the reward is still "
                              "scored and logged, but not trained on).")


GROUPS = {
    "data": DataConfig, "rollout": RolloutConfig, "algorithm": AlgorithmConfig,
    "reward": RewardConfig, "train": TrainConfig, "checkpoint": CheckpointConfig,
    "eval": EvalConfig, "cluster": ClusterConfig, "megatron": MegatronCompatConfig, "logging": LoggingConfig, "debug": DebugConfig,
    "agent": AgentConfig, "critic": CriticConfig,
    "rollout_store": RolloutStoreConfig, "lora": LoraConfig, "sandbox": SandboxConfig,
    "sft_distill": SftDistillConfig,
}

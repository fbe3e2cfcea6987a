"""slime's spellings of slick's flags: accepted, converted to slick's field, or refused by name.

A slime user's script must mean the same thing in slick. Where slime (``slime/utils/arguments.py``) or
the Megatron-LM flags it passes through name an option slick has under another name or unit, the slime
spelling is accepted here and lands on slick's field; a slime flag slick cannot honour is refused with
what to use instead (never accepted and ignored). ``tests/slime_flags.py`` holds the full comparison as
data. Standard library only.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import urlparse

from slick.config.slime_table import add_table_arguments, resolve_table, table_rows

PREFIX = "slime__"          # argparse dests of the slime spellings; removed before the Config is built
log = logging.getLogger("slick.config")


@dataclass(frozen=True)
class SlimeFlag:
    """One slime spelling: its flag, slick's field it sets (None: refused or resolved in pairs), how its value
    converts (``convert(value) -> slick value``, raising ValueError with the reason), and the help line."""
    flag: str
    field: Optional[str]
    help: str
    kw: dict
    convert: Optional[Callable[[Any], Any]] = None

    @property
    def dest(self) -> str:
        return PREFIX + self.flag[2:].replace("-", "_")


def _chunk(n: int) -> int:
    if n <= 0:
        raise ValueError("slime's -1 (no chunking) is not offered: slick always computes logprobs in chunks; "
                         "give a positive --logprob-chunk-size (tokens per chunk)")
    return n


def _transport(v: str) -> str:
    return {"nccl": "broadcast", "disk": "disk"}[v]


def _bucket(n: int) -> int:
    if n <= 0 or n % 2**20:
        raise ValueError(f"{n} bytes is not a positive whole number of MiB: slick's --weight-bucket-mb counts MiB "
                         f"(slime's default 536870912 bytes = 512 MiB)")
    return n // 2**20


def _minutes(m: float) -> float:
    if m <= 0:
        raise ValueError("must be > 0")
    return float(m) * 60.0


def _addrs(addrs: list) -> list:
    out = []
    for a in addrs:
        url = (a if "://" in a else f"http://{a}").rstrip("/")
        p = urlparse(url)
        if p.scheme not in ("http", "https") or not p.hostname or p.port is None:
            raise ValueError(f"{a!r} is not host:port or http://host:port")
        out.append(url)
    return out


FLAGS: list[SlimeFlag] = [
    SlimeFlag("--log-probs-chunk-size", "logprob_chunk_size", "slime's name of --logprob-chunk-size (a positive "
              "size; slime's -1, no chunking, is refused).", dict(type=int), _chunk),
    SlimeFlag("--lr-warmup-iters", "lr_warmup_steps", "Megatron's name of --lr-warmup-steps (optimizer steps).",
              dict(type=int)),
    SlimeFlag("--update-weight-transport", "weight_transport", "slime's weight transport: nccl = --weight-transport "
              "broadcast, disk = --weight-transport disk.", dict(choices=["nccl", "disk"]), _transport),
    SlimeFlag("--update-weight-buffer-size", "weight_bucket_mb", "slime's weight-update bucket in bytes: "
              "--weight-bucket-mb BYTES/2^20 (a whole number of MiB).", dict(type=int), _bucket),
    SlimeFlag("--distributed-timeout-minutes", "dist_timeout", "Megatron's collective timeout in minutes: "
              "--dist-timeout 60 x MINUTES seconds.", dict(type=float), _minutes),
    SlimeFlag("--rollout-external-engine-addrs", "rollout_urls", "slime's running SGLang engines (host:port or "
              "http://host:port): --rollout-engine http --rollout-urls http://host:port ...",
              dict(nargs="+"), _addrs),
    SlimeFlag("--use-rollout-routing-replay", "use_routing_replay", "slime's name of --use-routing-replay (the "
              "rollout engine's experts replayed in training).", dict(action="store_true")),
    SlimeFlag("--use-dynamic-batch-size", None, "slime's token-budget micro-batches; with --max-tokens-per-gpu N it is "
              "--max-tokens-per-micro-batch N (alone it is refused, as in slime).", dict(action="store_true")),
    SlimeFlag("--bf16", "dtype", "Megatron's bf16 training: --dtype bf16.", dict(action="store_const", const="bf16")),
    SlimeFlag("--data-source-path", None, "slime's rollout data source class: its default "
              "(slime.rollout.data_source.RolloutDataSourceWithBuffer) is slick's DataSource, prompts with a buffer "
              "of returned groups; another class is refused.", dict(type=str)),
    SlimeFlag("--max-tokens-per-gpu", None, "slime's token budget of a micro-batch; needs --use-dynamic-batch-size "
              "(without it slime does not use it, so it is refused).", dict(type=int)),
]

# slime/Megatron flags that ask for what slick always does: flag -> (argparse kw, what slick does); logged
ALWAYS: dict[str, tuple[dict, str]] = {
    "--balance-data": (dict(action="store_true"), "slick always splits each step's samples into token-balanced "
                                                  "shares across trainer ranks"),
    "--accumulate-allreduce-grads-in-fp32": (dict(action="store_true"), "slick keeps weight gradients in fp32 and "
                                                                        "FSDP reduces them in fp32"),
    "--attention-softmax-in-fp32": (dict(action="store_true"), "slick's training attention computes scores and "
                                                               "softmax in fp32"),
    "--optimizer": (dict(choices=["adam", "sgd"]), "slick's optimizer is AdamW, Megatron's adam (decoupled weight "
                                                   "decay: --weight-decay, --adam-beta1/2); sgd is refused"),
}

# slime/Megatron flags with no effect in slick: flag -> (argparse kw, why); accepted with a warning
NO_EFFECT: dict[str, tuple[dict, str]] = {
    "--num-data-workers": (dict(type=int), "slick reads the prompt file in the driver process (no data-loader "
                                           "workers)"),
    "--streaming-data": (dict(action="store_true"), "slick reads the whole prompt file at start (the same prompts; "
                                                    "--rollout-shuffle orders them)"),
    "--attention-backend": (dict(type=str), "slick picks its attention kernels itself (packed-segment attention in "
                                            "training, its own kernels in the engine)"),
}

# slime flags slick cannot honour: flag -> what to use instead (refused by name when given)
REFUSED: dict[str, str] = {
    "--offload": "slick keeps the trainer in memory; --offload-rollout frees the in-process engine's KV cache and "
                 "weight copies while the trainer steps",
    "--offload-train": "slick keeps the trainer in memory; use --offload-rollout, --gradient-checkpointing or "
                       "--exp-avg-dtype bf16 to lower the peak",
}

# defaults slick keeps although slime's differ: slime flag -> (slime's default, why)
KEPT_DEFAULTS: dict[str, tuple[str, str]] = {
    "--input-key": ("input", "slick's prompt files use `prompt`; a row without the key stops the run naming it"),
    "--label-key": ("unset", "slick reads a row's `label` when it has one (slime's unset gives no labels)"),
    "--rollout-batch-size": ("required", "slime requires the flag, so a slime script always gives it"),
    "--n-samples-per-prompt": ("1", "slick's default group of 8; a group of 1 gives zero GRPO advantages, "
                                    "refused at start"),
    "--rm-type": ("unset", "slime has no default reward: a slime script gives --rm-type or --custom-rm-path"),
    "--micro-batch-size": ("1", "the same gradients; unset, slick packs micro-batches to a token budget sized from "
                                "the model, the sequence lengths and the memory (logged at start-up)"),
    "--offload-rollout": ("false", "unset, slick train frees the in-process engine's memory while the trainer steps "
                                   "wherever a weight sync follows, which costs nothing there; --no-offload-rollout "
                                   "keeps it"),
    "--weight-decay": ("0.01", "slick keeps the 0.0 of TRL and Hugging Face's Trainer; given, it decays matrices "
                               "only (not biases or norm weights), as Megatron does"),
    "--log-probs-chunk-size": ("-1", "the same logprobs; slick always chunks (--logprob-chunk-size 128)"),
    "--actor-num-gpus-per-node": ("8", "slick's 0 is one trainer in the driver process (runs on CPU)"),
    "--rollout-num-gpus": ("derived", "slick's 0: the engine --rollout-engine picks"),
    "--update-weight-transport": ("nccl", "slick's --weight-transport auto: colocated in process, disk for HTTP "
                                          "engines; give --update-weight-transport nccl for slime's broadcast"),
    "--rotary-base": ("10000", "model-shape flags are checks in slick (config.json gives the model): unset is "
                               "not checked"),
    "--norm-epsilon": ("1e-05", "model-shape check: unset is not checked"),
    "--normalization": ("LayerNorm", "model-shape check: unset is not checked"),
    "--position-embedding-type": ("learned_absolute", "model-shape check: unset is not checked"),
    "--num-query-groups": ("1", "model-shape check: unset is not checked"),
    "--attention-dropout": ("0.1", "slick trains with config.json's attention_dropout; given, it is checked "
                                   "against it (slime's scripts pass 0.0)"),
    "--hidden-dropout": ("0.1", "slick's models have config.json's hidden dropout (none for Llama/Qwen); given, "
                                "it is checked against it (slime's scripts pass 0.0)"),
}

# kept defaults under which a slime script that leaves the flag out trains differently in slick (warned)
CHANGES_MEANING = ("--input-key", "--label-key", "--n-samples-per-prompt", "--weight-decay", "--attention-dropout",
                   "--hidden-dropout")
MEGATRON_SHAPE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                  "kv_channels", "seq_length", "rotary_base", "normalization", "swiglu",
                  "untie_embeddings_and_output_weights", "disable_bias_linear")


def slime_script_sign(ns: dict) -> Optional[str]:
    """The first flag in ``ns`` (parsed flags, the given ones only) that only a slime script carries: a slime
    spelling, or a Megatron model-shape flag (slime's scripts/models/*.sh give them); None for a slick command."""
    slime = [k for k in ns if k.startswith(PREFIX)]
    if slime:
        return "--" + slime[0][len(PREFIX):].replace("_", "-")
    shape = [k for k in MEGATRON_SHAPE if k in ns]
    return _flag(shape[0]) if shape else None


def slime_script_warnings(ns: dict) -> list[str]:
    """For a slime script (``slime_script_sign``), one line per flag of ``CHANGES_MEANING`` it leaves out: the run
    would differ from slime's, whose default is another. Empty for a slick command."""
    sign = slime_script_sign(ns)
    if sign is None:
        return []
    return [f"{flag} is not given: slime's default is {KEPT_DEFAULTS[flag][0]}, slick's differs "
            f"({KEPT_DEFAULTS[flag][1]}); this command reads as a slime script ({sign} given), so give {flag} to "
            f"say which is meant" for flag in CHANGES_MEANING if flag[2:].replace("-", "_") not in ns
            and not (flag == "--n-samples-per-prompt" and ns.get("loss_type") == "sft_loss")]   # SFT: 1, as slime


# slime's spellings with the slick field they set when it takes slick's own flag too (for conflicts)
_EXTRA_SETS = {"--rollout-external-engine-addrs": {"rollout_engine": "http"},
               "--use-dynamic-batch-size": {}, "--max-tokens-per-gpu": {}}
WARMUP_FRACTION = "--lr-warmup-fraction"
FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
DATA_SOURCES = ("slime.rollout.data_source.RolloutDataSourceWithBuffer",)


def add_slime_arguments(parser: argparse.ArgumentParser) -> None:
    """The slime spellings (group ``slime``) and the refused slime flags, all with SUPPRESSed defaults."""
    grp = parser.add_argument_group("slime", "slime's and Megatron's spellings of slick flags (docs/flags.md, "
                                             "slime users)")
    for f in FLAGS:
        grp.add_argument(f.flag, dest=f.dest, default=argparse.SUPPRESS, help=f.help, **f.kw)
    for flag, instead in REFUSED.items():
        grp.add_argument(flag, dest=PREFIX + flag[2:].replace("-", "_"), action="store_true",
                         default=argparse.SUPPRESS, help=f"Refused: {instead}.".replace("%", "%%"))
    for table, word in ((ALWAYS, "Accepted"), (NO_EFFECT, "No effect (a warning)")):
        for flag, (kw, why) in table.items():
            grp.add_argument(flag, dest=_dest(flag), default=argparse.SUPPRESS,
                             help=f"{word}: {why}.".replace("%", "%%"), **kw)
    add_table_arguments(grp)
    grp.add_argument(WARMUP_FRACTION, dest=_dest(WARMUP_FRACTION), type=float, default=argparse.SUPPRESS,
                     help="Megatron's warm-up as a fraction of the decay steps: --lr-warmup-steps = FRACTION x "
                          "--lr-decay-iters (or x the run's optimizer steps, --num-rollout x steps per rollout, when "
                          "those flags give them).")


def _dest(flag: str) -> str:
    return PREFIX + flag[2:].replace("-", "_")


def _noted_flags(ns: dict, problems: list[str]) -> None:
    """The ALWAYS and NO_EFFECT flags: logged, or (``--optimizer sgd``) refused."""
    for flag, (_, why) in ALWAYS.items():
        if _dest(flag) in ns:
            value = ns.pop(_dest(flag))
            if flag == "--optimizer" and value != "adam":
                problems.append(f"--optimizer {value}: not supported (slick's trainer uses AdamW: --optimizer adam, "
                                f"with --weight-decay, --adam-beta1, --adam-beta2)")
            else:
                log.info("%s: accepted (%s)", flag, why)
    for flag, (_, why) in NO_EFFECT.items():
        if _dest(flag) in ns:
            ns.pop(_dest(flag))
            log.warning("%s has no effect in slick: %s", flag, why)


def _optimizer_steps(ns: dict) -> Optional[int]:
    """The run's optimizer steps as far as the flags alone give them (Megatron's --lr-decay-iters default)."""
    if ns.get("lr_decay_iters"):
        return ns["lr_decay_iters"]
    n = ns.get("num_rollout")
    if n and ns.get("num_steps_per_rollout"):
        return n * ns["num_steps_per_rollout"]
    k = ns.get("n_samples_per_prompt") or (1 if ns.get("loss_type") == "sft_loss" else None)   # SFT implies 1
    rb, gb = ns.get("rollout_batch_size"), ns.get("global_batch_size")
    if n and rb and k and gb and (rb * k) % gb == 0:
        return n * (rb * k // gb)
    return None


def _decay_iters(ns: dict) -> None:
    """For a slime script (``slime_script_sign``): a decaying schedule without --lr-decay-iters decays over the
    run's optimizer steps, Megatron's default (its --lr-decay-iters is the training iterations), when the flags
    give them."""
    if ns.get("lr_decay_style") not in (None, "constant") and not ns.get("lr_decay_iters") \
            and _optimizer_steps(ns) is not None:
        ns["lr_decay_iters"] = _optimizer_steps(ns)
        log.info("--lr-decay-iters %d: the run's optimizer steps (Megatron's default for a slime script)",
                 ns["lr_decay_iters"])


def _reward_post_process(ns: dict, problems: list[str]) -> None:
    """--custom-reward-post-process-path: slime's replacement of GRPO's group normalisation; its rewards are the
    advantages, so normalisation is off, and only GRPO-style estimators have a place for it."""
    if not ns.get("custom_reward_post_process_path"):
        return
    estimator = ns.get("advantage_estimator", "grpo")
    if estimator not in ("grpo", "gspo"):
        problems.append(f"--custom-reward-post-process-path with --advantage-estimator {estimator}: slime's reward "
                        f"post-process replaces GRPO's group normalisation (grpo or gspo); for {estimator} use "
                        f"--custom-advantage-function-path")
    elif ns.get("custom_advantage_function_path"):
        problems.append("--custom-reward-post-process-path and --custom-advantage-function-path both set the "
                        "advantages: give one of them")
    else:
        ns["disable_rewards_normalization"] = True


SLIME_DEFAULT_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"   # slime's default (eval) rollout function


def _slime_hooks(ns: dict, problems: list[str]) -> None:
    """slime's train-data and loss hooks: where slime calls them, and what their place in slick rules out."""
    if ns.get("custom_convert_samples_to_train_data_path"):
        if ns.get("custom_reward_post_process_path"):
            problems.append("--custom-convert-samples-to-train-data-path replaces slime's reward post-process (its "
                            "rewards are the ones trained on): give it or --custom-reward-post-process-path")
        else:
            ns["disable_rewards_normalization"] = True   # slime normalises rewards in the conversion it replaces
    if ns.get("eval_function_path") == SLIME_DEFAULT_ROLLOUT:
        ns.pop("eval_function_path")
        log.info("--eval-function-path %s: slime's default eval rollout is slick's evaluation", SLIME_DEFAULT_ROLLOUT)
    if ns.get("eval_function_path") and ns.get("loss_type") == "sft_loss":
        problems.append("--eval-function-path: slick evaluates an SFT run on its held-out chats (--eval-prompt-data)")
    loss_hooks = [f for f in ("custom_tis_function_path", "custom_pg_loss_reducer_function_path") if ns.get(f)]
    other = "--custom-loss-function-path" if ns.get("custom_loss_function_path") else \
        "--loss-type sft_loss" if ns.get("loss_type") == "sft_loss" else None
    for field in loss_hooks if other else ():
        problems.append(f"{_flag(field)} is called inside the policy loss, which {other} replaces: give one of them")
    if ns.get("custom_tis_function_path") and not other:
        if not ns.get("use_tis"):
            problems.append("--custom-tis-function-path is called only with --use-tis (as in slime): add --use-tis")
        elif ns.get("tis_level", "token") != "token":
            problems.append(f"--custom-tis-function-path computes the TIS weights itself: drop --tis-level "
                            f"{ns['tis_level']}")


def _warmup_fraction(ns: dict, problems: list[str]) -> None:
    if _dest(WARMUP_FRACTION) not in ns:
        return
    frac = ns.pop(_dest(WARMUP_FRACTION))
    total = _optimizer_steps(ns)
    if not 0.0 <= frac <= 1.0:
        problems.append(f"{WARMUP_FRACTION} {frac}: must be in [0, 1]")
    elif total is None:
        problems.append(f"{WARMUP_FRACTION} {frac} is a fraction of the decay steps: give --lr-decay-iters N (or "
                        f"--num-rollout with --num-steps-per-rollout, or with --rollout-batch-size, "
                        f"--n-samples-per-prompt and --global-batch-size), or --lr-warmup-iters N")
    elif "lr_warmup_steps" in ns and ns["lr_warmup_steps"] != round(frac * total):
        problems.append(f"{WARMUP_FRACTION} {frac} (= --lr-warmup-steps {round(frac * total)}) disagrees with "
                        f"--lr-warmup-steps {ns['lr_warmup_steps']}: give one of them")
    else:
        ns["lr_warmup_steps"] = round(frac * total)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def resolve_slime_flags(ns: dict, driver: str = "sync") -> list[str]:
    """Move the slime spellings in ``ns`` (parsed flags, typed ones only) onto slick's fields, in place.
    Returns the problems: refused flags, bad values, and a slime spelling that disagrees with slick's own flag.
    ``driver``: the command's ("sync": slick train, "async": slick train-async)."""
    problems: list[str] = []
    if ns.get("rollout_function_path") == FULLY_ASYNC:
        if driver == "async":
            ns.pop("rollout_function_path")
            log.info("--rollout-function-path %s: slime's fully-async rollout is what slick train-async does",
                     FULLY_ASYNC)
        else:
            problems.append(f"--rollout-function-path {FULLY_ASYNC} is slime's fully-async rollout: run the "
                            f"command with slick train-async, which overlaps generation and training")
    script = slime_script_sign(ns) is not None
    for line in slime_script_warnings(ns):
        log.warning("%s", line)
    _noted_flags(ns, problems)
    resolve_table(ns, problems)
    given = {f.flag: ns.pop(f.dest) for f in FLAGS if f.dest in ns}
    for flag, instead in REFUSED.items():
        if ns.pop(PREFIX + flag[2:].replace("-", "_"), False):
            problems.append(f"{flag}: not supported by slick ({instead})")
    source = given.pop("--data-source-path", None)
    if source is not None and source not in DATA_SOURCES:
        problems.append(f"--data-source-path {source}: not supported by slick (slick's DataSource is slime's "
                        f"default {DATA_SOURCES[0]}: prompts in order, groups put back first; another class is "
                        f"not called)")
    dyn, tokens = given.pop("--use-dynamic-batch-size", False), given.pop("--max-tokens-per-gpu", None)
    if dyn and tokens is None:
        problems.append("--use-dynamic-batch-size needs --max-tokens-per-gpu N (slime asserts the same); in slick "
                        "it is --max-tokens-per-micro-batch N")
    elif tokens is not None and not dyn:
        problems.append(f"--max-tokens-per-gpu {tokens} without --use-dynamic-batch-size: slime does not use it "
                        f"then; for token-budget micro-batches pass both, or --max-tokens-per-micro-batch {tokens}")
    elif dyn:
        given["--use-dynamic-batch-size --max-tokens-per-gpu"] = tokens
    by_flag = {f.flag: f for f in FLAGS}
    for flag, value in given.items():
        f = by_flag.get(flag)
        field = f.field if f else "max_tokens_per_micro_batch"
        try:
            converted = f.convert(value) if f and f.convert else value
        except ValueError as e:
            problems.append(f"{flag} {_show(value)}: {e}")
            continue
        for name, want in [(field, converted), *_EXTRA_SETS.get(flag, {}).items()]:
            if name in ns and ns[name] != want:
                problems.append(f"{flag} {_show(value)} (= {_flag(name)} {_show(want)}) disagrees with "
                                f"{_flag(name)} {_show(ns[name])}: give one of them")
            else:
                ns[name] = want
    _warmup_fraction(ns, problems)      # after --lr-warmup-iters landed on lr_warmup_steps
    _reward_post_process(ns, problems)
    _slime_hooks(ns, problems)
    if script:
        _decay_iters(ns)
    return problems


def _show(v: Any) -> str:
    return " ".join(map(str, v)) if isinstance(v, list) else str(v)


def alias_rows() -> list[tuple[str, str]]:
    """(slime spelling, what it means in slick) for the docs."""
    rows = [(f.flag, f.help) for f in FLAGS]
    rows += [(flag, f"Accepted: {why}.") for flag, (_, why) in ALWAYS.items()]
    rows += [(flag, f"No effect (a warning): {why}.") for flag, (_, why) in NO_EFFECT.items()]
    rows.append((WARMUP_FRACTION, "Megatron's warm-up fraction: --lr-warmup-steps = FRACTION x --lr-decay-iters "
                                  "(or x --num-rollout x steps per rollout)."))
    return rows + [(flag, f"Refused: {instead}.") for flag, instead in REFUSED.items()] + table_rows()


def kept_rows() -> list[tuple[str, str, str]]:
    """(slime flag, slime's default, why slick's differs) for the docs."""
    return [(flag, d, why) for flag, (d, why) in KEPT_DEFAULTS.items()]


# ----------------------------------------------------------------------------- run checks (slick.configure.validate)
def megatron_checkpoint(path) -> bool:
    """Whether ``path`` is a Megatron checkpoint directory (slime's --load/--save, or a torch_dist conversion)."""
    d = Path(str(path))
    if not d.is_dir():
        return False
    return (d / "latest_checkpointed_iteration.txt").is_file() or any(d.glob("iter_*")) or \
        ((d / ".metadata").is_file() and any(d.glob("*.distcp")))


def has_checkpoint(path) -> bool:
    """Whether ``path`` holds a slick checkpoint or one being written (``slick.ckpt.checkpoint``'s names: a step
    directory itself, ``step_*`` directories, ``latest``), or a Megatron one."""
    d = Path(str(path))
    return d.is_dir() and ((d / "trainer_state.json").is_file() or (d / "latest").exists()
                           or any(d.glob("step_*")) or megatron_checkpoint(d))


def load_problems(cfg, p: list[str]) -> None:
    """--load and --ref-load as slime scripts give them (checked with the files)."""
    if cfg.load and not has_checkpoint(cfg.load):
        same = cfg.save and Path(cfg.save).resolve() == Path(cfg.load).resolve()
        if same:
            log.info("--load %s holds no checkpoint yet: the run starts fresh and --save writes there (as slime "
                     "does)", cfg.load)
        else:
            what = "a directory without one" if Path(cfg.load).is_dir() else "no such directory"
            p.append(f"--load {cfg.load}: no checkpoint there ({what}); to start fresh and checkpoint there give "
                     f"--save {cfg.load} too (as slime's scripts do), or drop --load")
    elif cfg.load and megatron_checkpoint(cfg.load):
        p.append(f"--load {cfg.load} is a Megatron checkpoint (slime's format); slick resumes only from its own "
                 f"checkpoints (--save): convert the weights to a Hugging Face directory and start from it with "
                 f"--hf-checkpoint")


def ref_load_problem(path) -> Optional[str]:
    if megatron_checkpoint(path):
        return (f"--ref-load {path} is a Megatron torch_dist checkpoint (what slime's scripts convert for Megatron); "
                f"slick reads Hugging Face directories: drop --ref-load (the reference is then --hf-checkpoint, the "
                f"model that checkpoint was converted from) or pass the Hugging Face directory of the reference")
    return None


def idle_flag_warnings(cfg) -> None:
    """A flag that does nothing in this run says so (slime accepts these silently)."""
    if cfg.save_interval is not None and not cfg.save:
        log.warning("--save-interval %s has no effect without --save DIR (nothing is checkpointed)", cfg.save_interval)
    if cfg.eval_interval is not None and not cfg.eval_prompt_data:
        log.warning("--eval-interval %s has no effect without --eval-prompt-data NAME PATH (nothing to evaluate)",
                    cfg.eval_interval)

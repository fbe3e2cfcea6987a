"""Automatic choices: what slick picks when a flag is left unset, from the work and the machine.

Each choice is a pure function of (model shape, sequence lengths, memory, cores, the flags that bear on it)
returning a :class:`Choice`: the value and the one line logged at start-up that says what was chosen and why.
``slick.configure.plan.derive_plan`` makes them once, before anything loads, and keeps the values in the frozen
``Plan``; a flag the user gives always wins (the function is not asked). The facts about the machine are read
by :func:`machine_now` and the model's shape from its ``config.json`` by :func:`ModelShape.from_config`; the
functions that decide take them as arguments, so tests give exact inputs and expect exact outputs.

* **Micro-batches** (:func:`micro_batch_tokens`): packed to a token budget (``--max-tokens-per-micro-batch``)
  sized so that a step's activations fit the memory left beside the trainer's state, and at most
  :data:`SPEED_PLATEAU_TOKENS`, past which bigger micro-batches are no faster (docs/training.md).
* **Lean settings** (:func:`lean_choice`): on a CPU, bf16 AdamW moments (bf16 training) and MLP recomputation by
  default; on a GPU, bf16 moments, then MLP recomputation, only when memory is short (fp32 moments and kept
  activations otherwise).
* **Sequences the engine decodes at once** (:func:`engine_slots`): up to :data:`ENGINE_SLOTS` (64 in slick
  train-async), fewer when their KV cache would not fit half the memory left beside the trainer's state
  (``--engine-max-running``).
* **The in-process engine's memory during a step** (:func:`offload_choice`): released whenever a weight sync
  follows the step (``--offload-rollout``), which rewrites every weight anyway.
* **Threads** and **the allocator**: chosen elsewhere (``slick.loop.threads``, ``slick.proc.memory``);
  :func:`threads_reason` and :func:`allocator_reason` word their log lines.

Standard library only (``psutil`` and torch are imported inside :func:`machine_now` when it runs).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any, Optional

log = logging.getLogger("slick")

GiB = 2**30
#: tokens per micro-batch past which a CPU step gets no faster (bench/step_profile.py --configs, docs/training.md)
SPEED_PLATEAU_TOKENS = 4096
#: a GPU's matmuls keep gaining from longer rows well past a CPU's
SPEED_PLATEAU_TOKENS_CUDA = 16384
#: share of the available memory slick plans to use (the rest: other processes, the page cache, estimate errors)
MEMORY_SHARE = 0.8
#: python, torch, transformers, the tokenizer and the allocator's own slack, before any model loads
RUNTIME_BYTES = 1 * GiB
#: a step's peak over the activations saved for backward (one layer's gradients, autograd's temporaries)
ACTIVATION_HEADROOM = 1.25
BUDGET_STEP = 128      # budgets are whole multiples of this many tokens
SHORT_MEMORY_TOKENS = 1024   # a budget below this is said to be short of memory, with what lowers the need
FALLBACK_MICRO_BATCH_SIZE = 8   # samples per micro-batch when no budget is sized (the Trainer's default too)
#: sequences slick's engine decodes at once by default: 400 questions at T=1 on a 2-core CPU take 1.26x less time
#: at 256 than at 64 for 4x the KV cache, 400 slots another 1.1x for 1.6x more (bench/results/engine_slots.md)
ENGINE_SLOTS = 256
#: ... and while the trainer steps beside it (slick train-async): bench/async.py's trainer took 26 s instead of 20
#: over 10 steps beside 256 slots (two rollout steps decoding at once), and train-async fell to 0.81x of slick train
OVERLAP_ENGINE_SLOTS = 64
FALLBACK_ENGINE_SLOTS = 64      # when the memory cannot be sized
KV_SHARE = 0.5                  # of the memory left beside the state, what the engine's KV cache may fill


@dataclass(frozen=True)
class Choice:
    """An automatic choice: the value and the one line that says what was chosen and why."""
    value: Any
    reason: str


#: the ``model_type`` of the HF decoders whose layers slick's fused layers cover (their ``FUSED_LAYERS``)
FUSED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only transformer depends on, read from its ``config.json``."""
    hidden: int
    layers: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = True
    fusable: bool = True     # slick's fused decoder layers cover its layers (slick/train/fused_layers.py)

    @classmethod
    def from_config(cls, c: dict) -> "ModelShape":
        """From a HF ``config.json`` dict (Llama, Mistral, Qwen2/3 keys); KeyError names a missing key."""
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        fusable = (c.get("model_type") in FUSED_MODEL_TYPES and c.get("hidden_act", "silu") in ("silu", "swish")
                   and not c.get("mlp_bias", False))
        return cls(hidden=hidden, layers=int(c["num_hidden_layers"]), vocab=int(c["vocab_size"]),
                   intermediate=int(c["intermediate_size"]), heads=heads,
                   kv_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or hidden // heads),
                   tied=bool(c.get("tie_word_embeddings", False)), fusable=fusable)

    @property
    def params(self) -> int:
        """Parameter count (attention without biases, a gated MLP, two norms per layer, tied head counted once)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = self.hidden * (2 * q + 2 * kv) + 3 * self.hidden * self.intermediate + 2 * self.hidden
        emb = self.vocab * self.hidden
        return self.layers * layer + emb * (1 if self.tied else 2) + self.hidden


@dataclass(frozen=True)
class Machine:
    """What the trainer process can use: memory available at start-up (bytes; a GPU's free memory on cuda),
    CPU cores, and the device the trainer runs on ("cpu" or "cuda")."""
    memory: int
    cores: int
    device: str = "cpu"


@dataclass(frozen=True)
class Training:
    """The flags that set how many bytes a step holds (resolved: ``matmul_bytes`` 2 for bf16, 4 for fp32)."""
    matmul_bytes: int = 2
    scheme: str = "autocast"            # fp32 | autocast | bf16 (slick.train.precision)
    exp_avg_bytes: int = 4
    exp_avg_sq_bytes: int = 4
    fused_layers: bool = True
    recompute_mlp: bool = False
    gradient_checkpointing: bool = False
    logprob_chunk: int = 128
    has_ref: bool = False
    critic: bool = False
    engine_in_process: bool = True      # the in-process engine shares this memory
    engine_released: bool = False       # ... and frees it while the trainer steps (--offload-rollout)
    engine_tokens: int = 64 * 256       # KV-cache tokens the engine may hold (running sequences x context)
    ranks: int = 1                      # trainer ranks sharing the machine (FSDP shards the state)
    frozen_base: bool = False           # LoRA: the base weights in the matmul dtype, no gradients or moments


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


def params_text(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


# ------------------------------------------------------------------------------------------ memory model
def activation_bytes_per_token(shape: ModelShape, t: Training) -> int:
    """Bytes a training forward keeps for backward per packed token (all layers, plus the embedding output,
    the final norm and the head's input). slick's fused layers (slick/train/fused_layers.py) keep per layer
    the residual stream once (fp32 under autocast), the qkv output, the attention output before and after
    o_proj and the gate/up product (dropped by --recompute-mlp); the HF layers keep about 3x what the fused
    ones kept with the residual stream twice; whole-layer recomputation keeps the layer inputs and one layer's
    worth."""
    r = 2 if t.scheme == "bf16" else 4          # residual stream dtype: the weights' (fp32 under autocast)
    m = t.matmul_bytes
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    residual = r + m if t.fused_layers else 2 * r
    layer = residual * shape.hidden + m * (q + 2 * kv) + m * q + 4 * shape.heads
    if not t.recompute_mlp:
        layer += m * 2 * shape.intermediate
    if not t.fused_layers:
        layer *= 3
    outside = 3 * r * shape.hidden
    if t.gradient_checkpointing:
        return shape.layers * r * shape.hidden + layer + outside
    return shape.layers * layer + outside


def state_bytes(shape: ModelShape, t: Training) -> int:
    """Bytes held through a step besides the activations: weights, gradients and AdamW moments per trainer
    rank, a frozen reference model, a critic, the in-process engine unless released, the lm head's cast and
    logits chunks, and the runtime."""
    p = shape.params
    per_param = 4 + 4 + t.exp_avg_bytes + t.exp_avg_sq_bytes           # fp32 weights and gradients, moments
    if t.scheme == "bf16":
        per_param += 2 + 2                                               # bf16 weights and gradients
    if t.frozen_base:
        per_param = t.matmul_bytes                                       # LoRA's adapters are ~1% of it
    trainer = per_param * p * (2 if t.critic else 1) // max(t.ranks, 1)
    ref = p * (2 if t.matmul_bytes == 2 else 4) if t.has_ref else 0
    engine = 0
    if t.engine_in_process and not t.engine_released:
        engine = p * t.matmul_bytes + kv_bytes_per_token(shape, t.matmul_bytes) * t.engine_tokens
    head = shape.vocab * shape.hidden * t.matmul_bytes + 3 * t.logprob_chunk * shape.vocab * 4
    return trainer + ref + engine + head + RUNTIME_BYTES


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """Bytes of the engine's KV cache per token of a running sequence (keys and values of every layer)."""
    return shape.layers * 2 * shape.kv_heads * shape.head_dim * dtype_bytes


# ------------------------------------------------------------------------------------------ the choices
def engine_slots(shape: ModelShape, machine: Machine, t: Training, seq: int, overlap: bool = False) -> Choice:
    """``--engine-max-running``: :data:`ENGINE_SLOTS` sequences at once (:data:`OVERLAP_ENGINE_SLOTS` when the
    engine decodes while the trainer steps, ``overlap``), or as many as fit when their KV cache at ``seq`` tokens
    each would fill more than :data:`KV_SHARE` of the memory left beside the whole trainer's state and the engine's
    weights (at least 1). The cache grows by need, so short sequences hold less."""
    per_seq = kv_bytes_per_token(shape, t.matmul_bytes) * seq
    beside = MEMORY_SHARE * machine.memory - state_bytes(shape, dataclasses.replace(
        t, engine_in_process=True, engine_released=False, engine_tokens=0, ranks=1))
    fits = int(max(beside, 0) * KV_SHARE // per_seq)
    most = OVERLAP_ENGINE_SLOTS if overlap else ENGINE_SLOTS
    slots = max(1, min(most, fits))
    if fits >= most and overlap:
        why = "slick train-async: more at once slow the trainer stepping beside the engine"
    elif fits >= most:
        why = "more gain little per byte of KV cache"
    elif fits:
        why = f"what {KV_SHARE:.0%} of the {gib(beside)} left beside the trainer's state and the engine's weights holds"
    else:
        why = "memory is short: the trainer's state and the engine's weights leave no room for more"
    return Choice(slots, f"auto: the engine decodes up to {slots} sequence{'s' * (slots > 1)} at once ({why}; its KV "
                         f"cache grows by need, to {gib(slots * per_seq)} at {seq} tokens each); --engine-max-running "
                         f"to override")


def micro_batch_tokens(shape: ModelShape, machine: Machine, t: Training, max_seq: Optional[int],
                       max_response: int) -> Choice:
    """The token budget of a packed micro-batch (``--max-tokens-per-micro-batch``): what the memory left
    beside the state holds (``MEMORY_SHARE`` of the available memory, activations with ``ACTIVATION_HEADROOM``),
    at most the speed plateau, in whole ``BUDGET_STEP``s and at least one step. ``max_seq``: the longest sample
    (prompt + response) when the prompt length is bounded, else None. The budget never splits a sample: a
    longer one gets a micro-batch of its own, so the gradients are the same whatever the budget."""
    per_token = activation_bytes_per_token(shape, t) * ACTIVATION_HEADROOM
    fixed = state_bytes(shape, t)
    plateau = SPEED_PLATEAU_TOKENS_CUDA if machine.device == "cuda" else SPEED_PLATEAU_TOKENS
    fits = fitting_tokens(shape, machine, t)
    tokens = max(BUDGET_STEP, min(plateau, fits) // BUDGET_STEP * BUDGET_STEP)
    seq = f"sequences <= {max_seq} tokens" if max_seq else f"responses <= {max_response} tokens"
    facts = (f"model {params_text(shape.params)}, {gib(machine.memory)} available, {gib(fixed)} for weights, "
             f"optimizer and engine, {per_token / 1024:.0f} KiB of activations per token, {seq}")
    if fits >= plateau:
        why = "larger micro-batches are no faster"
    elif fits < SHORT_MEMORY_TOKENS or (max_seq and tokens < max_seq):
        why = ("memory is short: a longer sample gets a micro-batch of its own, and --recompute-mlp and "
               "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 lower the need")
    else:
        why = "what the memory holds"
    return Choice(tokens, f"auto: micro-batches of <= {tokens} tokens ({why}; {facts}); "
                          f"--max-tokens-per-micro-batch or --micro-batch-size to override")


def fitting_tokens(shape: ModelShape, machine: Machine, t: Training) -> int:
    """Packed tokens whose activations (with ``ACTIVATION_HEADROOM``) fit ``MEMORY_SHARE`` of the machine's memory
    per rank beside the state (0 when the state alone does not fit)."""
    usable = MEMORY_SHARE * machine.memory / max(t.ranks, 1) - state_bytes(shape, t)
    return int(max(usable, 0) // (activation_bytes_per_token(shape, t) * ACTIVATION_HEADROOM))


def short_of_memory(fits: int, max_seq: Optional[int]) -> bool:
    """Whether a micro-batch of ``fits`` tokens is short: under ``SHORT_MEMORY_TOKENS``, or under the longest
    sample (``max_seq``, when the prompt length is bounded)."""
    return fits < SHORT_MEMORY_TOKENS or bool(max_seq and fits < max_seq)


#: the lean settings in the order they are taken when memory is short: (what each sets, its name, its cost, the
#: flags that undo it)
LEAN_STEPS = (({"exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}, "bf16 AdamW moments",
               "4 bytes less per parameter, stochastic rounding", "--exp-avg-dtype fp32 --exp-avg-sq-dtype fp32"),
              ({"recompute_mlp": True}, "MLP recomputation", "~45% less activation memory, ~15% more trainer FLOPs",
               "--no-recompute-mlp"),
              ({"gradient_checkpointing": True}, "whole-layer recomputation",
               "only the layer inputs kept, one more forward (~1/3 more trainer FLOPs)", "--no-gradient-checkpointing"))
LEAN_DEFAULTS = {"exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32", "recompute_mlp": False,
                 "gradient_checkpointing": False}


def lean_defaults_named(value: dict) -> list[str]:
    """The lean defaults in ``value`` in words: "fp32 AdamW moments" (either moment's dtype), "MLP activations
    kept"."""
    return [w for f, w in (("exp_avg", "fp32 AdamW moments"), ("recompute_mlp", "MLP activations kept"))
            if any(k.startswith(f) for k in value)]


def cpu_recomputes_mlp(machine: Machine, t: Training, unset: frozenset) -> bool:
    """Whether MLP recomputation is on by default: on CPU, with slick's fused layers and without whole-layer
    recomputation, when ``--recompute-mlp`` is unset. It changes no number (the same matmul on the same inputs),
    keeps ~45% of the activations out of the memory the engine and the rest of the machine share, and costs
    ~3% of a run's time there (``bench/results/memory_timeline.md``); on a GPU it stays a memory-short step."""
    return ("recompute_mlp" in unset and machine.device == "cpu" and t.fused_layers
            and not t.gradient_checkpointing)


def cpu_narrows_moments(machine: Machine, t: Training, unset: frozenset) -> bool:
    """Whether bf16 AdamW moments are the default: on CPU, training in bf16, neither moment's dtype given, a full
    trainer (a LoRA trainer's few adapter moments are not worth narrowing). They hold 4 bytes less per parameter;
    on ``bench/vs_trl.py``'s task their held-out curve stayed within one standard deviation of fp32 moments' at
    every evaluation over 3 seeds (docs/training.md, "Where the memory goes"); on a GPU they stay a memory-short
    step."""
    return ({"exp_avg_dtype", "exp_avg_sq_dtype"} <= unset and machine.device == "cpu" and t.matmul_bytes == 2
            and not t.frozen_base)


CPU_MOMENTS = ("bf16 AdamW moments, the CPU default for bf16 training (4 bytes less per parameter, stochastic "
               "rounding; --exp-avg-dtype fp32 --exp-avg-sq-dtype fp32 to keep fp32)")
CPU_RECOMPUTE = ("MLP recomputation, the CPU default (the same numbers, ~45% less activation memory, ~3% more "
                 "time; --no-recompute-mlp to keep the activations)")


def lean_choice(shape: ModelShape, machine: Machine, t: Training, max_seq: Optional[int], unset: frozenset) -> Choice:
    """The flags of ``LEAN_DEFAULTS`` the user left unset (``unset``), as {field: value}: on CPU bf16 moments
    (:func:`cpu_narrows_moments`) and MLP recomputation (:func:`cpu_recomputes_mlp`); the other defaults (fp32
    moments, MLP activations kept on a GPU) when memory suffices; when it is short (:func:`short_of_memory` at the
    tokens that fit), each of ``LEAN_STEPS`` in turn until it is not. MLP recomputation needs slick's fused
    layers, and a LoRA trainer's few adapter moments are not worth narrowing. ``t``: the run's settings with the
    unset flags at their defaults."""
    value = {f: LEAN_DEFAULTS[f] for f in LEAN_DEFAULTS if f in unset}
    moments = cpu_narrows_moments(machine, t, unset)
    if moments:
        value.update(exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
        t = dataclasses.replace(t, exp_avg_bytes=2, exp_avg_sq_bytes=2)
    on_cpu = cpu_recomputes_mlp(machine, t, unset)
    if on_cpu:
        value["recompute_mlp"] = True
        t = dataclasses.replace(t, recompute_mlp=True)
    before = fits = fitting_tokens(shape, machine, t)
    taken = []
    for sets, *what in LEAN_STEPS:
        if not short_of_memory(fits, max_seq):
            break
        mine = {f: v for f, v in sets.items() if f in unset and value[f] != v}
        if not mine or ("recompute_mlp" in mine and not t.fused_layers) or ("exp_avg_dtype" in sets and t.frozen_base):
            continue
        value.update(mine)
        changes = {f.replace("_dtype", "_bytes"): 2 for f in mine if f.endswith("_dtype")}
        changes.update({f: True for f in ("recompute_mlp", "gradient_checkpointing") if f in mine})
        t = dataclasses.replace(t, **changes)
        fits = fitting_tokens(shape, machine, t)
        taken.append(what)
    facts = f"{before} tokens of activations fit beside the state" + (f", {fits} with them" if taken else "")
    cpu = ([CPU_MOMENTS] if moments else []) + ([CPU_RECOMPUTE] if on_cpu else [])
    if not taken:
        kept = lean_defaults_named({f: v for f, v in value.items() if not (on_cpu and f == "recompute_mlp")
                                    and not (moments and f.startswith("exp_avg"))})
        state = ("memory is short, and no lean setting left unset applies" if short_of_memory(before, max_seq)
                 else "memory suffices")
        lower = [flags for flags, done in (("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", moments),
                                           ("--recompute-mlp", on_cpu)) if not done]
        head = f"{', '.join(kept)} ({state}: {facts})" if kept else f"{state}: {facts}"
        return Choice(value, "auto: " + "; ".join([head, *cpu] + ([f"{' or '.join(lower)} to lower the peak"]
                                                                   if lower else [])))
    return Choice(value, "auto: " + "; ".join([
        f"{_and([n for n, _, _ in taken])}, since memory is short: {facts} "
        f"({'; '.join(f'{n}: {cost}' for n, cost, _ in taken)})",
        f"{' '.join(undo for _, _, undo in taken)} to override", *cpu]))


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def fallback_micro_batch(why: str) -> Choice:
    """Micro-batches of a sample count when no budget can be sized (``why``: what is unknown)."""
    return Choice(None, f"auto: micro-batches of {FALLBACK_MICRO_BATCH_SIZE} samples ({why}); "
                        f"--max-tokens-per-micro-batch or --micro-batch-size to override")


def offload_choice(blockers: list[str]) -> Choice:
    """``--offload-rollout`` when nothing blocks it: the engine's KV cache and packed weights are freed while
    the trainer steps and the weight sync that follows (which rewrites every weight anyway) packs them again:
    a lower peak for the same speed. ``blockers``: why it cannot apply (no in-process engine, no sync
    after the step, ...)."""
    if blockers:
        return Choice(False, f"auto: the in-process engine keeps its memory while the trainer steps "
                             f"({'; '.join(blockers)})")
    return Choice(True, "auto: the in-process engine's KV cache and packed weights are freed while the trainer "
                        "steps (--offload-rollout; the weight sync after the step packs them again); "
                        "--no-offload-rollout to keep them")


def threads_reason(cores: int, train: int, rollout: int, overlap: bool, flags: bool) -> str:
    """The start-up line of the CPU thread split (``slick.loop.threads.ThreadPolicy``)."""
    if flags:
        return f"CPU threads: training {train}, rollout {rollout} (--train-num-threads / --rollout-num-threads)"
    if overlap:
        return (f"auto: CPU threads: training {train} of {cores} while the engine generates, all {cores} while "
                f"it is idle; the engine {rollout} (slick train-async overlaps the phases); "
                f"--train-num-threads / --rollout-num-threads to override")
    return (f"auto: CPU threads: all {cores} for rollout and for training in turn (torch's default, one per "
            f"physical core); --train-num-threads / --rollout-num-threads to override")


def allocator_reason(loaded: bool, installed: bool, choice: str, tuned: bool = False) -> tuple[int, str]:
    """(logging level, line) of the CPU allocator in use: tcmalloc, or why not, said once and plainly.
    ``tuned``: glibc's settings of ``slick.proc.memory.tune_cpu_allocator`` are in effect."""
    glibc = "glibc, tuned" if tuned else "glibc"
    if loaded:
        return logging.INFO, "CPU allocator: tcmalloc"
    if choice == "glibc":
        return logging.INFO, f"CPU allocator: {glibc} (SLICK_ALLOCATOR=glibc)"
    if not installed:
        return logging.WARNING, (f"CPU allocator: {glibc}: tcmalloc is not installed, and training runs about 1.2x "
                                 "slower without it; `make tcmalloc` or `sudo apt-get install libtcmalloc-minimal4` "
                                 "installs it (docs/training.md, The allocator)")
    return logging.WARNING, (f"CPU allocator: {glibc}: tcmalloc is installed but not preloaded (the `slick` command "
                             "preloads it; a script that imports slick keeps its own process's allocator: run it "
                             "with LD_PRELOAD=libtcmalloc_minimal.so.4)")


def onednn_cache_reason(capacity: Optional[str], default: int) -> str:
    """The line naming oneDNN's primitive cache capacity (``capacity``: ONEDNN_PRIMITIVE_CACHE_CAPACITY or None;
    ``default``: the entry points' value, slick.proc.children.ONEDNN_CACHE_ENTRIES)."""
    if capacity is None:
        return "oneDNN primitive cache: 1024 entries (oneDNN's default; ONEDNN_PRIMITIVE_CACHE_CAPACITY unset)"
    if capacity == str(default):
        return (f"auto: oneDNN primitive cache: {default} entries instead of 1024 (a micro-batch's shapes are new "
                "almost every step; their cached kernels are never reused); ONEDNN_PRIMITIVE_CACHE_CAPACITY to "
                "override")
    return f"oneDNN primitive cache: {capacity} entries (ONEDNN_PRIMITIVE_CACHE_CAPACITY)"


# ------------------------------------------------------------------------------------------ the facts
def machine_now(device: str = "cpu") -> Machine:
    """This machine now: memory available (``psutil``; a GPU's free memory for ``device`` "cuda") and the CPU
    cores this process may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        cores = os.cpu_count() or 1
    if device == "cuda":
        import torch

        return Machine(int(torch.cuda.mem_get_info()[0]), cores, "cuda")
    import psutil

    return Machine(int(psutil.virtual_memory().available), cores, "cpu")


def log_choices(choices: list[Choice]) -> None:
    for c in choices:
        log.info("%s", c.reason)

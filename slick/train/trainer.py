"""The Trainer: HF causal LM + AdamW, packed micro-batches, chunked logprobs, one optimizer step per call.

The trainer does not know the RL algorithm: ``train_step(batch, objective)`` receives the step's
``slick.algo.batch.TrainBatch`` (the one contract from the loop to any trainer: samples and per-sample columns)
and an ``objective`` with the signature of ``slick.algo.objective.compute_policy_objective`` minus ``cfg``,
taking one ``slick.algo.LossInputs``: the head's output and the batch's columns under their own names::

    loss, metrics = objective(LossInputs(logprobs[B,T], entropy[B,T], mask[B,T], advantages[B,T],
                                         old_logprobs=None|[B,T], ref_logprobs=None|[B,T],
                                         rollout_logprobs=None|[B,T], num_samples=int, num_tokens=int))

called once per packed micro-batch with the *global* normalisers, so summing the micro-batch losses gives
the global-batch loss and accumulated gradients equal the one-big-batch gradient. The metrics a loss_fn
returns must be additive in the same way (slick.algo reduces every metric with the global normalisers);
the trainer sums them over micro-batches.

The head and the loss are pluggable: the head is the forward module (``_fwd``) and what it predicts per response
token, the loss is ``objective``. The policy head (this class) predicts logprobs and trains on advantages; the value
head (``slick.train.critic.Critic``: ``head = "value"``) predicts ``values`` and trains on the batch's ``returns``
around its ``values`` column (the rollout's, ``old_values`` in the loss) with
``slick.train.critic.value_objective``, through this class's ``train_step`` and its one micro-batch loop.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Callable, Iterator, Optional, Sequence

import torch

from slick.config import Config, ConfigView
from slick.algo.correction import GAP_THRESHOLD, gap_stats
from slick.algo.inputs import LossInputs
from slick.train.probe import candidate_logprobs
from slick.proc import dist as D
from slick.train.casts import cached_weight_casts
from slick.proc.memory import tune_cpu_allocator
from slick.train.optim import make_adamw
from slick.train.fsdp import make_mesh, reshard, shard, total_norm
from slick.train.heads import PolicyHead
from slick.train import fsdp_lora, trainer_io
from slick.train.frozen import load_frozen
from slick.algo.batch import TrainBatch
from slick.train.packing import (PackedBatch, pack, pack_shared_prompts, pad_stack, seq_tokens, shares_prompts,
                                 split_micro_batches)
from slick.train.precision import resolve_device, resolve_dtype, resolve_scheme
from slick.train.teacher import load_teacher
from slick.types import Sample

LOSS_KEY = "loss"
DEFAULT_MICRO_BATCH_SIZE = 8   # samples, when neither --micro-batch-size nor a token budget is set
log = logging.getLogger(__name__)
_PAD = Sample(index=-1, prompt_ids=[0], response_ids=[0])   # the zero-contribution micro-batch of short ranks


class Trainer:
    """Policy model, optional frozen reference model, AdamW with linear warm-up, grad clipping.

    ``cfg``: a ``slick.config.Config`` or a view with the groups in ``CONFIG_GROUPS`` (the trainer keeps only those). ``precision`` picks the bf16 scheme
    (``"autocast"`` default, or ``"bf16"``; see ``slick.train.precision``); ignored for fp32.

    Built while ``torch.distributed`` is initialised with world_size > 1 (``slick.proc.dist``), it is one
    FSDP2 rank (``slick.train.fsdp``): every public method is then collective -- all ranks call it with the
    same full arguments and get the same result; each rank computes its share of the samples.
    """

    #: the config groups the policy trainer reads (slick.config.ConfigView); a value trainer reads ValueHead's
    CONFIG_GROUPS = PolicyHead.CONFIG_GROUPS

    def __init__(self, cfg: Config | ConfigView, model_path: Optional[str] = None, precision: Optional[str] = None,
                 *, thread_budget: Optional[Callable[[], Optional[int]]] = None, head=None):
        self.head = head = head or PolicyHead()   # what is trained (slick.train.heads): policy or value
        self.cfg = cfg = cfg.view(*head.CONFIG_GROUPS)
        self.model_path = head.model_path(cfg, model_path)
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        if precision is None and self.dtype != torch.float32:
            precision = cfg.train_precision  # --train-precision (ignored for fp32)
        self.scheme = resolve_scheme(self.dtype, precision)
        if self.device.type == "cpu":
            tune_cpu_allocator()
        self.rank, self.world_size = D.world()
        self.fsdp = self.world_size > 1
        # FSDP shards fp32 master weights; its mixed-precision policy gives the bf16 scheme its bf16 compute
        weight_dtype = head.weight_dtype(cfg, self.dtype) or (
            torch.bfloat16 if self.scheme == "bf16" and not self.fsdp else torch.float32)
        loaded = head.load(cfg, self.model_path, weight_dtype, self.device)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.lora, self.fused_layers, self.moe = loaded.lora, loaded.fused_layers, loaded.moe
        self.mesh = make_mesh(self.device) if self.fsdp else None
        if self.fsdp:
            module, root = loaded.shard_parts
            with D.named_errors(f"sharding the {head.name} model"):
                self._fwd = shard(module, self.mesh, torch.bfloat16 if self.scheme == "bf16" else None, root=root)
        else:
            self._fwd = head.local_forward(loaded)
        self.param_names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if self.scheme == "bf16" and not self.fsdp:
            self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        else:
            self.master = self.params
        self.optimizer = make_adamw(self.master, cfg.train, head.lr(cfg))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, head.lr_factor(cfg))
        self.version = 0
        self.skipped_steps = 0      # optimizer steps skipped for a non-finite loss or gradient norm
        self.thread_budget = thread_budget   # () -> CPU threads for the next micro-batch or None (loop/threads.py)
        #: the pass under way, read by the step's progress lines (slick/observe/step_progress.py):
        #: (what, micro-batches done, of how many), or None between passes
        self.work: Optional[tuple[str, int, int]] = None
        self._nonfinite_losses = 0  # micro-batches of the last forward_backward with a non-finite loss
        self.ref_model, self._ref_fwd = None, None   # the KL terms' frozen reference (slick/train/frozen.py)
        if self.has_ref and self.lora is None:   # LoRA's reference: the base, adapters disabled
            self.ref_model, self._ref_fwd = load_frozen(cfg.ref_load or self.model_path, self, "the reference model")
        self.teacher_model, self._teacher_fwd = (load_teacher(self) if head.name == "policy"   # --use-opd
                                                 else (None, None))

    # ------------------------------------------------------------------ properties
    @property
    def has_ref(self) -> bool:
        """True when a KL term needs the frozen reference model (a policy head only)."""
        return self.head.has_ref(self.cfg)

    @property
    def temperature(self) -> float:
        """The logprob temperature (--rollout-temperature; a policy head's)."""
        return float(self.cfg.rollout_temperature)

    def _autocast(self):
        if self.scheme == "autocast":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _cast_once(self):
        """Around a micro-batch loop: the lm head's weight is cast to bf16 once per loop (``slick.train.casts``;
        the fused decoder layers cast theirs at each use), and one autocast region, so that HF layers (not
        fused: ``--disable-fused-layers``) cast each weight once per loop too (autocast keeps its casts until the
        outermost region ends; not under FSDP, whose gathered weights must be freed after each layer)."""
        stack = contextlib.ExitStack()
        stack.enter_context(cached_weight_casts())   # the lm head's cast (FusedLogprobEntropy), fwd and bwd
        if self.scheme == "autocast" and not self.fsdp:
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16))
        return stack

    # ------------------------------------------------------------------ forward
    def _forward(self, fwd, mb: PackedBatch, with_entropy: bool, entropy_grad: bool):
        """Per-sample head outputs (logprobs or values) and entropies (None) of one packed micro-batch."""
        return self.head.forward(self, fwd, mb.to(self.device), with_entropy, entropy_grad)

    def _pack(self, samples: Sequence, idx: list[int]) -> PackedBatch:
        """Pack a micro-batch; samples sharing a prompt share one copy of it unless disabled."""
        shared = not self.cfg.disable_prompt_sharing and shares_prompts(samples, idx)
        mb = pack_shared_prompts(samples, idx) if shared else pack(samples, idx)
        if self.moe is not None:
            mb.routing = self.moe.packed_ids(samples, idx, mb.gather_index)
        return mb

    def _plan(self, samples: Sequence) -> list[list[list[int]]]:
        """Per rank: its micro-batches (lists of indices into ``samples``); one rank when not distributed.

        Ranks get contiguous, token-balanced shares (``dist.split_for_ranks``); every rank computes the same
        plan, so each knows how many zero-contribution micro-batches it must add to match the longest rank.
        """
        def split(sub):
            return split_micro_batches(sub, self.cfg.micro_batch_size or DEFAULT_MICRO_BATCH_SIZE,
                                       self.cfg.max_tokens_per_micro_batch,
                                       shared_prompts=not self.cfg.disable_prompt_sharing)

        if not self.fsdp:
            return [split(samples)]
        plans = []
        for share in D.split_for_ranks([seq_tokens(s) for s in samples], self.world_size):
            plans.append([[share[j] for j in mb] for mb in split([samples[i] for i in share])])
        return plans

    def _micro_batches(self, plan: list[list[list[int]]], what: str) -> Iterator[Optional[list[int]]]:
        """This rank's micro-batches in order, then ``None`` for each padding pass; before each, the CPU thread
        count from ``thread_budget`` when one is set. :attr:`work` says how far the pass (``what``) is."""
        mine = plan[self.rank if self.fsdp else 0]
        pads = max(len(p) for p in plan) - len(mine)
        todo = list(mine) + [None] * pads
        try:
            for done, idx in enumerate(todo):
                self.work = (what, done, len(todo))
                threads = self.thread_budget() if self.thread_budget is not None else None
                if threads is not None:
                    torch.set_num_threads(threads)
                yield idx
        finally:
            self.work = None

    def _pad_pass(self, fwd, backward: bool) -> None:
        """A one-token forward (and backward of a zero loss) that only runs FSDP's collectives."""
        lps, _ = self._forward(fwd, pack([_PAD], [0]), with_entropy=False, entropy_grad=False)
        if backward:
            (lps[0].sum() * 0.0).backward()

    def _zero_gradients(self) -> None:
        """Give every trained weight an exact zero gradient: zeros in one process; under FSDP one token's zero
        backward, whose collectives every rank must run."""
        if self.fsdp:
            self._pad_pass(self._fwd, backward=True)
            return
        for m in self.master:
            m.grad = torch.zeros_like(m)

    def _collective(self, what: str):
        return D.named_errors(what) if self.fsdp else contextlib.nullcontext()

    @torch.no_grad()
    def candidate_logprobs(self, token_ids: Sequence[int], candidates: Sequence) -> Optional[list]:
        """The actor's T=1 logprobs of ``candidates[i]`` at each position i+1 of ``token_ids`` (the mismatch probe,
        slick/train/probe.py); one process only (None in a sharded rank)."""
        if self.fsdp:
            return None
        return candidate_logprobs(self.model, token_ids, candidates, self.device, self._autocast())

    def compute_logprobs(self, samples: Sequence, which: str = "actor") -> list[torch.Tensor]:
        """fp32 CPU tensors ``[T_i]``: logprob of each response token under the actor or reference model."""
        if which == "actor":
            fwd = self._fwd
        elif which == "ref" and self.lora is not None:
            fwd = self._fwd   # under self.lora.mode(reference=True): the adapters disabled
        elif which == "ref":
            if self.ref_model is None:
                raise ValueError("compute_logprobs(which='ref') but no reference model is loaded "
                                 "(needs --use-kl-loss with --kl-loss-coef > 0, or --kl-coef > 0)")
            fwd = self._ref_fwd
        elif which == "teacher" and self._teacher_fwd is not None:
            fwd = self._teacher_fwd
        else:
            raise ValueError(f"which must be 'actor', 'ref' or, with --use-opd, 'teacher' (got {which!r})")
        result: list[torch.Tensor] = [torch.zeros(0) for _ in samples]
        plan = self._plan(samples)
        lora_mode = self.lora.mode(which == "ref") if self.lora is not None else contextlib.nullcontext()
        with self._collective(f"compute_logprobs({which!r})"), self._cast_once(), lora_mode:
            for idx in self._micro_batches(plan, f"{which} logprobs"):
                if idx is None:
                    self._pad_pass(fwd, backward=False)
                    continue
                lps, _ = self._forward(fwd, self._pack(samples, idx), with_entropy=False, entropy_grad=False)
                for i, lp in zip(idx, lps):
                    result[i] = lp.detach().float().cpu()
        if not self.fsdp:
            return result
        reshard(fwd)   # no backward followed: the root's parameters would stay gathered (slick.train.fsdp.reshard)
        shares = [[i for mb in p for i in mb] for p in plan]
        local = torch.cat([result[i] for i in shares[self.rank]] + [torch.zeros(0)])
        sizes = [sum(len(samples[i].response_ids) for i in sh) for sh in shares]
        for sh, flat in zip(shares, D.all_gather_flat(local, sizes, f"compute_logprobs({which!r}) gather")):
            for i, lp in zip(sh, flat.split([len(samples[i].response_ids) for i in sh])):
                result[i] = lp.clone()
        return result

    # ------------------------------------------------------------------ training
    def train_step(self, batch: TrainBatch, objective: Callable) -> dict:
        """One optimizer step over ``batch`` (the global batch). Returns prefix-free float metrics.

        The policy head reads the batch's ``advantages`` (and ``old_logprobs``, ``ref_logprobs`` when computed),
        the value head its ``returns`` and ``values`` (``slick.train.critic.value_objective``); every column holds
        1-D per-token tensors of the response's length. Equals :meth:`forward_backward` followed by
        :meth:`optimizer_step`; ``skipped_steps`` is 1.0 when that step was skipped (non-finite loss or
        gradient norm: weights unchanged), else 0.0.
        """
        t0 = time.perf_counter()
        out = self.forward_backward(batch, objective)
        t1 = time.perf_counter()
        out["lr"] = float(self.optimizer.param_groups[0]["lr"])
        skipped_before = self.skipped_steps
        out["grad_norm"] = self.optimizer_step()
        out["skipped_steps"] = float(self.skipped_steps - skipped_before)
        t2 = time.perf_counter()
        out["optimizer_time"], out["step_time"] = t2 - t1, t2 - t0
        if self.fsdp:   # the slowest rank's times, the same on every rank
            out["optimizer_time"], out["step_time"] = D.all_reduce_values(
                [out["optimizer_time"], out["step_time"]], "max", "train_step timing")
        out["tokens_per_sec"] = out["tokens"] / max(out["step_time"], 1e-9)
        out.update(self.moe.pop_metrics() if self.moe is not None else {})
        return out

    def forward_backward(self, batch: TrainBatch, objective: Callable) -> dict:
        """Zero the gradients, then forward + backward every packed micro-batch of ``batch`` (none: every
        gradient is exactly zero, and the optimizer step that follows steps on that).

        Leaves the accumulated global-batch gradient in the optimizer's parameters' ``.grad`` (fp32 master
        copies in the bf16 scheme). Returns the metrics of :meth:`train_step` minus the optimizer ones, plus
        ``nonfinite_losses``: the micro-batches whose loss was NaN/inf. Those get no backward, and the next
        :meth:`optimizer_step` is skipped.
        """
        needed = ("advantages",) if self.head.name == "policy" else ("returns", "values")
        missing = [c for c in needed if getattr(batch, c) is None]
        if missing and len(batch):
            raise ValueError(f"train_step: the {self.head.name} head trains on the batch's {' and '.join(needed)}; "
                             f"{', '.join(missing)} not computed")
        t0 = time.perf_counter()
        samples = batch.samples
        num_samples = len(samples)
        num_tokens = int(sum(sum(m) for m in batch.loss_mask))
        entropy_grad = self.head.name == "policy" and bool(self.cfg.entropy_coef)   # the value head has no entropy
        sums: dict[str, float] = {}
        total_loss, diff_sum, diff_n, tokens, nonfinite = 0.0, 0.0, 0, 0, 0
        diff_max, diff_over = 0.0, 0.0
        self.optimizer.zero_grad(set_to_none=True)
        self._nonfinite_losses = 0
        plan = self._plan(samples)
        with self._collective("train_step forward/backward"), self._cast_once():
            for idx in self._micro_batches(plan, "training"):
                if idx is None:
                    self._pad_pass(self._fwd, backward=True)
                    continue
                mb = self._pack(samples, idx)
                tokens += mb.num_tokens
                lps, ents = self._forward(self._fwd, mb, with_entropy=True, entropy_grad=entropy_grad)
                inputs = self._loss_inputs(batch, idx, max(mb.response_lengths), lps, ents, num_samples, num_tokens)
                if inputs.rollout_logprobs is not None:   # train/inference mismatch (slick/algo/correction.py)
                    gap = gap_stats(inputs.logprobs, inputs.rollout_logprobs, inputs.mask, GAP_THRESHOLD)
                    diff_sum += gap["abs_sum"]
                    diff_n += int(gap["n"])
                    diff_max, diff_over = max(diff_max, gap["abs_max"]), diff_over + gap["over"]
                loss, metrics = objective(inputs)
                total_loss += float(loss.detach())
                nonfinite += 0 if self._backward(loss, inputs) else 1
                for k, v in (metrics or {}).items():
                    if k != LOSS_KEY:
                        sums[k] = sums.get(k, 0.0) + float(v)
            if not any(plan):   # no sample: every gradient is exactly zero, and the optimizer steps on that
                self._zero_gradients()
        elapsed = time.perf_counter() - t0
        if self.fsdp:   # additive metrics summed over ranks, times maxed: the same dict on every rank
            totals = [total_loss, tokens, nonfinite, diff_sum, diff_n, diff_over]
            sums, totals, diff_max, elapsed = D.step_metrics_over_ranks(sums, totals, diff_max, elapsed)
            total_loss, tokens, nonfinite, diff_sum, diff_n, diff_over = totals
        self._nonfinite_losses = int(nonfinite)
        out = dict(sums, loss=total_loss, tokens=float(tokens), response_tokens=float(num_tokens),
                   nonfinite_losses=float(nonfinite), fwd_bwd_time=elapsed)
        if diff_n:   # train/inference mismatch (slick/algo/correction.py, docs/vllm.md)
            out.update(train_rollout_logprob_abs_diff=diff_sum / diff_n, train_rollout_logprob_abs_diff_max=diff_max,
                       train_rollout_logprob_gap_frac=diff_over / diff_n)
        return out

    def _backward(self, loss, inputs: LossInputs) -> bool:
        """One micro-batch's backward; False when its loss is NaN/inf: no real backward, and this global batch's
        optimizer step will be skipped."""
        if math.isfinite(float(loss.detach())):
            loss.backward()
            if self.scheme == "bf16" and not self.fsdp:
                self._accumulate_master_grads()
            return True
        if self.fsdp:   # the other ranks' backward collectives still need this rank's
            (inputs.logprobs if inputs.values is None else inputs.values).sum().mul(0.0).backward()
        return False

    def _loss_inputs(self, batch: TrainBatch, idx, T, out, ents, num_samples, num_tokens) -> LossInputs:
        """The objective's inputs for the micro-batch of samples ``idx``: the head's output (``out``: logprobs or
        values) and every computed column of ``batch`` right-padded to ``T``; the rollout's logprobs when every
        sample has them (a policy head only)."""
        dev = self.device

        def column(seq):
            return None if seq is None else pad_stack([torch.as_tensor(seq[i], device=dev) for i in idx], T,
                                                      dtype=torch.float32)

        samples = batch.samples
        roll = None
        if self.head.name == "policy" and all(len(samples[i].rollout_logprobs) == len(samples[i].response_ids)
                                         for i in idx):
            roll = column([s.rollout_logprobs for s in samples])
        head_out = pad_stack(out, T, dtype=torch.float32)
        policy = self.head.name == "policy"
        return LossInputs(head_out if policy else None,
                          pad_stack(ents, T, dtype=torch.float32) if ents is not None else None,
                          column(batch.loss_mask), column(batch.advantages),
                          old_logprobs=column(batch.old_logprobs), ref_logprobs=column(batch.ref_logprobs),
                          rollout_logprobs=roll, num_samples=num_samples, num_tokens=num_tokens,
                          values=None if policy else head_out, returns=column(batch.returns),
                          old_values=None if policy else column(batch.values),
                          prompt_lengths=[len(samples[i].prompt_ids) for i in idx],
                          response_lengths=[len(samples[i].response_ids) for i in idx])

    def _accumulate_master_grads(self) -> None:
        for p, m in zip(self.params, self.master):
            if p.grad is None:
                continue
            g = p.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    def optimizer_step(self) -> float:
        """Clip the accumulated gradients (``clip_grad``), AdamW step, scheduler step, zero grads;
        ``version += 1``. Returns the pre-clip gradient norm.

        Skipped when the last :meth:`forward_backward` saw a non-finite loss (the norm returned is then NaN)
        or the gradient norm is NaN/inf: the gradients are zeroed, and weights, optimizer and scheduler state
        and ``version`` stay as they were; ``skipped_steps`` counts it and a warning is logged.
        """
        clip = float(self.cfg.clip_grad or 0.0)
        grads = [m for m in self.master if m.grad is not None]
        bad_losses, self._nonfinite_losses = self._nonfinite_losses, 0
        if bad_losses:   # the same count on every rank (summed in forward_backward)
            norm = float("nan")
        else:
            with self._collective("gradient norm"):
                norm_t = total_norm([m.grad for m in grads])   # global over ranks when sharded
                if clip > 0:
                    torch.nn.utils.clip_grads_with_norm_(grads, clip, norm_t)
            norm = float(norm_t)
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            why = (f"non-finite loss in {bad_losses} micro-batch(es)" if bad_losses
                   else f"non-finite gradient norm ({norm})")
            log.warning("optimizer step skipped at weights version %d: %s; gradients zeroed, weights unchanged "
                        "(%d skipped so far)", self.version, why, self.skipped_steps)
            return norm
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheme == "bf16" and not self.fsdp:
            with torch.no_grad():
                for p, m in zip(self.params, self.master):
                    p.copy_(m)
        self.version += 1
        return norm

    # ------------------------------------------------------------------ weights
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF parameter name, detached tensor) for every parameter; tied weights appear once.

        Sharded: full (all-gathered) tensors in the model's compute dtype (bf16 in the bf16 scheme), the same
        names in the same order on every rank; collective, so every rank must exhaust the iterator.
        """
        return trainer_io.named_weights(self)

    def adapter_payload(self):
        """The LoRA adapter alone, for engines that merge it on arrival (``slick.weights.lora_sync``); None without
        LoRA. Sharded: all-gathered (collective, slick.train.fsdp_lora)."""
        if self.lora is None:
            return None
        return fsdp_lora.adapter_payload(self) if self.fsdp else self.lora.adapter_payload()

    async def send_weights(self, sink) -> float:
        """Push the current weights to ``sink``'s engines (a ``slick.train.protocol.WeightSink``): this process
        holds them, so the sink sends them from here. Returns the seconds."""
        return await sink.send(self)

    def full_precision_state_dict(self) -> dict[str, torch.Tensor]:
        """HF-named weights at full precision (fp32 master copies in the bf16 scheme), tied weights once.
        Sharded: full tensors on every rank (collective)."""
        return trainer_io.full_precision_state_dict(self)

    def save_hf_files(self, out_dir) -> None:
        """Write a loadable HF directory (weights at full precision, config, generation config, tokenizer).
        Sharded: collective; rank 0 writes (slick.train.trainer_io). A policy head's only."""
        self.head.save_hf_files(self, out_dir)

    # ------------------------------------------------------------------ save / load
    def save(self, out_dir) -> None:
        """Model, optimizer, scheduler, RNG states and version into ``out_dir`` (slick.train.trainer_io).

        One process: a full HF dir under ``model/`` (LoRA: PEFT's ``adapter/``) + ``optimizer.pt``... Sharded: a
        ``torch.distributed.checkpoint`` directory (``slick.ckpt.dcp``), collective, ``trainer_state.json``
        written last by rank 0. Both load with any number of ranks. A value head writes its own layout
        (``slick.train.heads.ValueHead.save``).
        """
        self.head.save(self, out_dir)

    def load(self, in_dir) -> None:
        """Restore everything :meth:`save` wrote, in either format, whatever the number of ranks that wrote it
        (the model architecture must match). Collective when sharded."""
        self.head.load_state(self, in_dir)

    @torch.no_grad()
    def compute_values(self, samples: Sequence) -> list[torch.Tensor]:
        """A value head's fp32 CPU tensors ``[T_i]``: the value at each response token of each sample."""
        if self.head.name != "value":
            raise ValueError("compute_values: this trainer trains the policy head (values come from the critic)")
        return self.compute_logprobs(samples, "actor")   # the one micro-batch loop, over the value forward

    def close(self) -> None:
        """Nothing to release in one process (the trainer protocol's ``close``; Ray ranks stop theirs)."""

"""Mixture-of-experts blocks in the trainer: slick's routing with optional routing replay, and its metrics.

:func:`use_slick_moe` gives every HF sparse-MoE block of the policy (Mixtral's ``MixtralSparseMoeBlock``,
Qwen3-MoE's ``Qwen3MoeSparseMoeBlock``) a forward that routes with :mod:`slick.algo.routing`: the router's
softmax-then-top-k (renormalised as the model's config says) and the experts grouped per expert, equal to HF's
block. While a :class:`MoeRouting` replays a micro-batch (:meth:`MoeRouting.replaying`), every token that has
recorded experts runs through *those* experts instead of its own top-k; their gate weights are the router's own
softmax read at the replayed ids (renormalised alike), so the router still gets its gradient from its own logits
(routing replay, R3; without replay the records only feed ``moe/mismatch``). Tokens without a record (the last
row of each sample, or a sample the engine gave no routing) use their own top-k. Every forward adds per-layer
statistics (expert load, router entropy, and the fraction of recorded tokens whose own top-k differs) that
:meth:`MoeRouting.pop_metrics` reads out.
"""
from __future__ import annotations

import contextlib
import logging
import types
from collections import defaultdict
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from slick.algo.routing import decode_routing, expert_mix, replay_weights, route, routing_stats
from slick.proc import dist as D

MOE_BLOCKS = ("MixtralSparseMoeBlock", "Qwen3MoeSparseMoeBlock")
log = logging.getLogger("slick.train")


class MoeRouting:
    """The policy's MoE blocks (in layer order), the micro-batch's replayed experts and the collected statistics."""

    def __init__(self, blocks: list, replay: bool):
        self.blocks, self.replay = blocks, replay
        self.top_k = int(blocks[0].gate.top_k)
        self._ids: Optional[torch.Tensor] = None      # [N, layers, k] long, -1 where nothing was recorded
        self._stats: dict[str, list[float]] = defaultdict(list)

    @contextlib.contextmanager
    def replaying(self, ids: Optional[torch.Tensor]):
        """Within: the blocks use ``ids`` [N, layers, k] (-1 rows: their own top-k) for a packed row of N."""
        self._ids = ids
        try:
            yield
        finally:
            self._ids = None

    def packed_ids(self, samples: Sequence, indices: list[int], gather: torch.Tensor) -> Optional[torch.Tensor]:
        """The recorded experts of ``samples[indices]`` laid out on their packed row (``gather``: the row of each
        response token's prediction, as ``PackedBatch.gather_index``): prompt position t of a sample whose last
        prompt row is g0 sits at row ``g0 - P + 1 + t``, response input j at ``gather[1 + j]``. None unless some
        sample carries a routing of the right length (``P + R - 1`` tokens). Without replay the blocks only
        compare their own choice with it (``moe/mismatch``)."""
        n = int(gather.max()) + 1 if gather.numel() else 0
        out, start, missing = None, 0, 0
        for i in indices:
            s = samples[i]
            P, R = len(s.prompt_ids), len(s.response_ids)
            rows = gather[start:start + R]
            start += R
            ids = decode_routing(getattr(s, "routed_experts", None))
            if ids is None or ids.shape[0] != P + R - 1 or ids.shape[1:] != (len(self.blocks), self.top_k):
                missing += 1
                continue
            if out is None:
                out = torch.full((n, len(self.blocks), self.top_k), -1, dtype=torch.long)
            pos = torch.cat([torch.arange(int(rows[0]) - P + 1, int(rows[0]) + 1), rows[1:].cpu()])
            out[pos] = ids.long()
        self._stats["replay_missing_samples"].append(float(missing))
        return out

    def block_ids(self, j: int, n: int) -> Optional[torch.Tensor]:
        if self._ids is None or self._ids.shape[0] != n:
            return None
        return self._ids[:, j].to(self.blocks[j].gate.weight.device)

    def add(self, j: int, stats: dict) -> None:
        for k, v in stats.items():
            self._stats[f"{k}/layer{j}"].append(v)

    def pop_metrics(self) -> dict[str, float]:
        """Means since the last call: ``moe/load_max/layer{j}``, ``moe/load_mean/layer{j}`` (tokens per expert),
        ``moe/entropy/layer{j}``, ``moe/mismatch/layer{j}`` (tokens with a record only), the averages over layers
        (``moe/load_max`` ...) and ``moe/replay_missing_samples``. On FSDP ranks (collective: every rank calls it
        once per step) the means are over every rank's micro-batches, the same dict on each rank."""
        sums = {k: (sum(v), len(v)) for k, v in self._stats.items() if v}
        if D.is_distributed():
            merged: dict[str, tuple[float, int]] = {}
            for part in D.all_gather_objects(sums, "MoE routing metrics"):
                for k, (s, n) in part.items():
                    a, b = merged.get(k, (0.0, 0))
                    merged[k] = (a + s, b + n)
            sums = dict(sorted(merged.items()))
        out = {f"moe/{k}": s / n for k, (s, n) in sums.items()}
        for k in ("load_max", "load_mean", "entropy", "mismatch"):
            vals = [v for key, v in out.items() if key.startswith(f"moe/{k}/layer")]
            if vals:
                out[f"moe/{k}"] = sum(vals) / len(vals)
        self._stats.clear()
        return out


def _moe_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    gate, state, j = self.gate, self._slick_routing, self._slick_index
    logits = F.linear(x, gate.weight)
    normalize = bool(getattr(gate, "norm_topk_prob", True))   # Mixtral always renormalises
    w, own = route(logits, gate.top_k, normalize)
    ids, replayed = own, state.block_ids(j, x.shape[0])
    if replayed is not None:
        has = replayed[:, 0] >= 0
        if state.replay:
            ids = torch.where(has.unsqueeze(1), replayed, own)
            w = replay_weights(logits, ids, normalize)
        replayed = replayed[has]
    if hasattr(gate, "norm_topk_prob"):   # Qwen3-MoE rounds its gate weights to the logits' dtype
        w = w.to(logits.dtype)
    stats = routing_stats(logits.detach(), own, gate.num_experts)   # the router's own choice over all tokens
    if replayed is not None and replayed.shape[0]:   # mismatch: over the tokens that were replayed
        stats["mismatch"] = routing_stats(logits.detach()[has], own[has], gate.num_experts, replayed)["mismatch"]
    state.add(j, stats)
    return expert_mix(x, ids, w, self.experts.gate_up_proj, self.experts.down_proj).view(shape)


def use_slick_moe(model: torch.nn.Module, replay: bool) -> Optional[MoeRouting]:
    """Give ``model``'s sparse-MoE blocks slick's forward; the :class:`MoeRouting` over them, None for a dense
    model. ``replay``: micro-batches whose samples carry recorded experts replay them (``--use-routing-replay``)."""
    blocks = [m for m in model.modules() if type(m).__name__ in MOE_BLOCKS]
    if not blocks:
        return None
    for b in blocks:
        if getattr(b, "jitter_noise", 0):
            raise ValueError(f"router_jitter_noise={b.jitter_noise}: slick's MoE blocks do not add router jitter "
                             "(set it to 0 in config.json)")
    if not replay:
        log.warning("mixture-of-experts model (%d MoE layers) without --use-routing-replay: the trainer routes every "
                    "token with its own router, which can choose other experts than the rollout engine did "
                    "(moe/mismatch measures how often; docs/moe.md)", len(blocks))
    state = MoeRouting(blocks, replay)
    for j, b in enumerate(blocks):
        b._slick_routing, b._slick_index = state, j
        b.forward = types.MethodType(_moe_forward, b)
    return state


def fuse_expert_weights(sd: dict, model: torch.nn.Module) -> dict:
    """``sd`` with the per-expert tensors a saved checkpoint holds (Mixtral ``block_sparse_moe.experts.{j}.w1/w3/w2``
    and ``block_sparse_moe.gate``, Qwen3-MoE ``mlp.experts.{j}.gate/up/down_proj``) stacked into ``model``'s fused
    parameters (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``, ``mlp.experts.down_proj`` ``[E, H, I]``) where those
    are missing; a dense model's ``sd`` is returned as it is."""
    shapes = {n: p.shape for n, p in model.named_parameters()}
    for n in sorted(set(shapes) - set(sd)):
        if not n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight")):
            continue
        p = n[:n.index("mlp.")]
        for mod, (g, u, dn) in (("block_sparse_moe", ("w1", "w3", "w2")),
                                ("mlp", ("gate_proj", "up_proj", "down_proj"))):
            e = p + f"{mod}.experts."
            if n.endswith("mlp.gate.weight") and p + f"{mod}.gate.weight" in sd:
                sd[n] = sd.pop(p + f"{mod}.gate.weight")
            elif e + f"0.{g}.weight" in sd:
                count = shapes[n][0]
                if n.endswith("gate_up_proj"):
                    sd[n] = torch.stack([torch.cat([sd[e + f"{j}.{g}.weight"], sd[e + f"{j}.{u}.weight"]])
                                         for j in range(count)])
                else:
                    sd[n] = torch.stack([sd[e + f"{j}.{dn}.weight"] for j in range(count)])
    return sd

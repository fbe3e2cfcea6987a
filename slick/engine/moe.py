"""Mixture-of-experts layers for the engine: what ``config.json`` says about the experts, and one layer's block.

:func:`parse_moe` reads the expert fields of a Mixtral (``num_local_experts``, ``num_experts_per_tok``,
``intermediate_size``; top-k weights always renormalised) or Qwen3-MoE config (``num_experts`` /
``num_local_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``,
``decoder_sparse_step``, ``mlp_only_layers``) and refuses, naming the field, what the engine does not run (shared
experts, grouped or biased routing, router jitter, more than 256 experts).

:class:`MoeBlock` holds one layer's router ``[E,H]`` and experts (``gate_up [E,2I,H]``, ``down [E,H,I]``, HF's fused
layout) and runs them with :mod:`slick.algo.routing`. Its weights answer to HF's fused names (what a transformers
model's ``named_parameters`` gives: ``mlp.experts.gate_up_proj``) and to the per-expert names checkpoints are
saved with (Mixtral ``block_sparse_moe.experts.{j}.w1/w3/w2``, Qwen3-MoE ``mlp.experts.{j}.gate/up/down_proj``).
Every forward leaves the chosen expert ids (uint8) per token in the model's :class:`RoutingRecorder`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from slick.algo.routing import expert_mix, route

MOE_ARCHS = ("mixtral", "qwen3_moe")
#: config fields of MoE variants the engine does not run (a non-zero / non-null value is refused by name)
UNSUPPORTED_FIELDS = ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts",
                      "n_group", "topk_group", "routed_scaling_factor", "first_k_dense_replace",
                      "moe_layer_freq", "router_jitter_noise")
MAX_EXPERTS = 256   # expert ids are recorded as uint8


@dataclass(frozen=True)
class MoeSpec:
    """The experts of a model: ``layers`` are the decoder layers that have them (the others are dense)."""

    num_experts: int
    top_k: int
    intermediate: int
    normalize: bool
    layers: tuple[int, ...]
    prefix: str          # the checkpoint's per-expert module name: "block_sparse_moe" (Mixtral) or "mlp"


def parse_moe(c: dict, mt: str, num_layers: int, source: str) -> Optional[MoeSpec]:
    """The :class:`MoeSpec` of config dict ``c`` (model_type ``mt``), None for a dense model; ``ValueError`` naming
    the field for a variant the engine does not run."""
    if mt not in MOE_ARCHS:
        return None
    for f in UNSUPPORTED_FIELDS:
        if c.get(f):
            raise ValueError(f"{source}: {f}={c[f]!r} is not supported for {mt} "
                             "(slick runs top-k routed experts without shared experts, groups or jitter)")
    if mt == "mixtral":
        E, inter, norm, prefix = c.get("num_local_experts"), c.get("intermediate_size"), True, "block_sparse_moe"
        layers = tuple(range(num_layers))
    else:
        E = c.get("num_experts", c.get("num_local_experts"))
        inter, norm, prefix = c.get("moe_intermediate_size"), bool(c.get("norm_topk_prob", False)), "mlp"
        step = int(c.get("decoder_sparse_step", 1) or 1)
        only = set(c.get("mlp_only_layers") or [])
        layers = tuple(i for i in range(num_layers) if i not in only and E and (i + 1) % step == 0)
    k = c.get("num_experts_per_tok")
    for name, v in (("num_experts" if mt == "qwen3_moe" else "num_local_experts", E), ("num_experts_per_tok", k),
                    ("moe_intermediate_size" if mt == "qwen3_moe" else "intermediate_size", inter)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{source}: {name}={v!r} must be a positive integer for {mt}")
    if E > MAX_EXPERTS or k > E:
        raise ValueError(f"{source}: num_experts_per_tok={k} of {E} experts: slick runs at most {MAX_EXPERTS} "
                         "experts and k <= experts")
    return MoeSpec(E, k, inter, norm, layers, prefix)


class RoutingRecorder:
    """The experts every MoE layer chose in the model's last forward call (the first MoE layer starts a call)."""

    def __init__(self):
        self._layers: list[torch.Tensor] = []

    def add(self, first: bool, ids: torch.Tensor) -> None:
        if first:
            self._layers = []
        self._layers.append(ids.to(torch.uint8).cpu())

    def take(self) -> torch.Tensor:
        """``[tokens, MoE layers, k]`` uint8 of the last forward (every token row it ran, padding included)."""
        out, self._layers = torch.stack(self._layers, dim=1), []
        return out


class MoeBlock:
    """One layer's router and SwiGLU experts, in the engine's dtype (allocated by ``e``)."""

    def __init__(self, spec: MoeSpec, hidden: int, e, layer: int, recorder: RoutingRecorder):
        E, inter = spec.num_experts, spec.intermediate
        self.spec, self.first, self.recorder = spec, layer == spec.layers[0], recorder
        self.router = e(E, hidden)
        self.gate_up = e(E, 2 * inter, hidden)
        self.down = e(E, hidden, inter)

    def targets(self, p: str) -> tuple[dict[str, torch.Tensor], set[str]]:
        """``(name -> view, alias names)`` for layer prefix ``p`` (``model.layers.{i}.``): the per-expert checkpoint
        names, and HF's fused in-memory names as aliases (an update may use either; a load needs the former)."""
        s, inter = self.spec, self.spec.intermediate
        t = {p + f"{s.prefix}.gate.weight": self.router}
        names = ("w1", "w3", "w2") if s.prefix == "block_sparse_moe" else ("gate_proj", "up_proj", "down_proj")
        for j in range(s.num_experts):
            q = p + f"{s.prefix}.experts.{j}."
            t[q + f"{names[0]}.weight"] = self.gate_up[j, :inter]
            t[q + f"{names[1]}.weight"] = self.gate_up[j, inter:]
            t[q + f"{names[2]}.weight"] = self.down[j]
        alias = {p + "mlp.experts.gate_up_proj": self.gate_up, p + "mlp.experts.down_proj": self.down}
        if s.prefix != "mlp":
            alias[p + "mlp.gate.weight"] = self.router
        t.update(alias)
        return t, set(alias)

    def out(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``x + experts(h)`` for the normed ``h`` [..., H] (any leading shape), recording the routing if asked."""
        flat = h.reshape(-1, h.shape[-1])
        logits = torch.nn.functional.linear(flat, self.router)
        w, ids = route(logits, self.spec.top_k, self.spec.normalize)
        self.recorder.add(self.first, ids)
        return x + expert_mix(flat, ids, w, self.gate_up, self.down).view(h.shape)

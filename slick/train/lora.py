"""LoRA adapters on the policy, through PEFT: adapter-only training with the base model frozen.

``--lora-rank R`` (or ``--lora-load ADAPTER``) makes the trainer wrap its causal LM with PEFT's LoRA layers
(:class:`PolicyLora`). The base weights are frozen and stored in the compute dtype (bf16 where the machine has
it, so a frozen base costs 2 bytes per parameter); the adapters (``lora_A``, ``lora_B``) are fp32 and are the
only parameters the optimizer sees. What this module gives the trainer:

* :meth:`PolicyLora.mode`: the forward without dropout, and with the adapters disabled for the KL reference
  (the base model, with no second copy in memory);
* :meth:`PolicyLora.merged_weights`: HF-named weights with every adapter merged (``W + B @ A * alpha / r``), what
  the engines receive and what an HF export holds;
* :meth:`PolicyLora.save_adapter` / :meth:`PolicyLora.load_adapter`: PEFT's adapter directory
  (``adapter_config.json`` + ``adapter_model.safetensors``), what a checkpoint holds.

Target names follow PEFT: a name matches a linear layer whose full name is it or ends with ``.<name>``;
``all-linear`` is every linear layer but the output layer (on a mixture-of-experts model: not the routers or the
experts, which are not linear layers). :func:`target_problems` checks names and rank against a
model (:func:`meta_model` builds one without weights, so validation loads nothing).
"""
from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from slick.config import Config, ConfigView
from slick.models.adapter_check import ADAPTER, ADAPTER_WEIGHTS, weights_problems
from slick.train.fsdp import decoder_layers
from slick.train.lora_spec import ALL_LINEAR, LoraSpec, read_adapter_config, spec_from_config
from slick.train.moe import MOE_BLOCKS
from slick.weights.lora_sync import AdapterPayload, peft_config_dict

# ---------------------------------------------------------------------------------------------- checks
def meta_model(model_dir) -> nn.Module:
    """The causal LM of ``model_dir``'s config.json on the meta device: its modules and shapes, no weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    """Full name -> ``nn.Linear`` of every linear layer but the output layer (PEFT's ``all-linear`` set)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and m is not out}


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def _has_experts(model: nn.Module) -> bool:
    return any(type(m).__name__ in MOE_BLOCKS for m in model.modules())


def peft_targets(model: nn.Module, spec: LoraSpec):
    """What PEFT is given: ``spec``'s names, except that ``all-linear`` on a mixture-of-experts model names its linear
    layers (attention, dense MLPs) one by one: PEFT's own ``all-linear`` also wraps the routers and the fused experts,
    whose forward slick runs itself (``slick.train.moe``), so adapters there would train and change nothing."""
    if spec.targets == (ALL_LINEAR,) and _has_experts(model):
        return sorted({n.rsplit(".", 1)[-1] for n in linear_layers(model)})
    return spec.peft_targets()


def target_problems(model: nn.Module, spec: LoraSpec, where: str = "the model") -> list[str]:
    """Target names that match no linear layer (listing the layers by name) and layers narrower than the rank."""
    layers = linear_layers(model)
    short = sorted({n.rsplit(".", 1)[-1] for n in layers})
    problems = []
    if spec.targets == (ALL_LINEAR,):
        chosen = list(layers)
    else:
        chosen = [n for n in layers if any(_matches(n, t) for t in spec.targets)]
        moe = (" (a mixture-of-experts model: slick's LoRA adapts linear layers only; the routers and the experts "
               "stay frozen, docs/moe.md)") if _has_experts(model) else ""
        for t in spec.targets:
            if not any(_matches(n, t) for n in layers):
                problems.append(f"--lora-target-modules: {t!r} matches no linear layer of {where}{moe}; its linear "
                                f"layers are {', '.join(short)} (or use all-linear)")
    if not chosen and not problems:
        problems.append(f"--lora-target-modules: {where} has no linear layer to adapt")
    for n in chosen:
        m = layers[n]
        width = min(m.in_features, m.out_features)
        if spec.rank > width:
            problems.append(f"--lora-rank {spec.rank} is larger than layer {n} of {where} (in {m.in_features}, "
                            f"out {m.out_features}): a rank above {width} adds parameters and no expressiveness")
            break
    return problems


def check_adapter_files(d, rank: int, model: nn.Module) -> None:
    """The adapter directory ``d`` against ``model`` before PEFT reads it: tensor names, dtypes and shapes from the
    safetensors header (``slick.models.adapter_check``), then every value finite; ValueError naming the file."""
    shapes = {n.replace(".base_layer.", "."): tuple(p.shape) for n, p in model.named_parameters()}
    problems = weights_problems(d, rank, shapes)
    if problems:
        raise ValueError("; ".join(problems))
    from safetensors import safe_open

    with safe_open(str(Path(d) / ADAPTER_WEIGHTS), framework="pt") as h:
        for name in h.keys():
            if not bool(torch.isfinite(h.get_tensor(name)).all()):
                raise ValueError(f"{Path(d) / ADAPTER_WEIGHTS}: tensor {name!r} holds NaN or infinite values")


# ---------------------------------------------------------------------------------------------- memory
def recompute_mlps(model: nn.Module) -> int:
    """Make every decoder layer's MLP recompute its inside in backward (``torch.utils.checkpoint``, non-reentrant):
    a training forward keeps the MLP's input instead of its gate, up, activation and product tensors (4 x the
    intermediate width per token per layer, about half of what a HF decoder layer keeps). LoRA runs the HF layers
    (PEFT wraps their linear layers), not slick's fused ones, so their MLP activations would otherwise all stay;
    this is what ``--recompute-mlp`` (a CPU default) does inside the fused layers of a full fine-tuning run. The
    same matmuls on the same inputs give the same numbers (dropout's RNG state is replayed). Forwards without
    gradients (logprobs, the reference) run as before. Returns how many MLPs were wrapped (the module names, and
    so the state dict, are unchanged)."""
    try:
        layers = decoder_layers(model)
    except ValueError:
        return 0
    n = 0
    for layer in layers:
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not hasattr(mlp, "down_proj") or getattr(mlp, "_slick_recomputed", False):
            continue
        inner = mlp.forward

        def forward(x, _inner=inner):
            if torch.is_grad_enabled():
                return checkpoint(_inner, x, use_reentrant=False)
            return _inner(x)
        mlp.forward = forward
        mlp._slick_recomputed = True
        n += 1
    return n


# ---------------------------------------------------------------------------------------------- the policy
class PolicyLora:
    """PEFT's LoRA layers injected into ``model`` (a HF causal LM, changed in place: the trainer keeps using it
    directly); the base frozen, the adapters fp32 and trainable."""

    def __init__(self, model: nn.Module, spec: LoraSpec, where: str = "the model"):
        from peft import LoraConfig, PeftModel, get_peft_model

        problems = target_problems(model, spec, where)
        if problems:
            raise ValueError("; ".join(problems))
        self.spec = spec
        self.model = model
        with warnings.catch_warnings():   # PEFT asks transformers a deprecated gradient-checkpointing question
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            if spec.load:
                check_adapter_files(spec.load, spec.rank, model)
                self.peft = PeftModel.from_pretrained(model, spec.load, adapter_name=ADAPTER, is_trainable=True)
            else:
                conf = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                                  target_modules=peft_targets(model, spec), bias="none", task_type="CAUSAL_LM")
                self.peft = get_peft_model(model, conf, adapter_name=ADAPTER)
        if spec.load:   # dropout is this run's choice (--lora-dropout), not the adapter file's
            for m in self._lora_layers().values():
                m.lora_dropout[ADAPTER] = nn.Dropout(p=spec.dropout) if spec.dropout else nn.Identity()
        for n, p in model.named_parameters():   # PEFT freezes the base; adapters trained in fp32
            if p.requires_grad:
                p.data = p.data.float()
        self.recomputed_mlps = recompute_mlps(model)

    def frozen_bytes(self) -> int:
        """Bytes of the frozen base's parameters (no gradients, no optimizer state)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if not p.requires_grad)

    def _lora_layers(self) -> dict[str, nn.Module]:
        from peft.tuners.lora import LoraLayer

        return {n: m for n, m in self.model.named_modules() if isinstance(m, LoraLayer)}

    @contextlib.contextmanager
    def mode(self, reference: bool = False):
        """Forward passes without dropout (eval mode), and with the adapters off when ``reference``: the base
        model, the KL reference. Restores training mode and the adapters after."""
        was_training = self.model.training
        self.model.eval()
        try:
            if reference:
                with self.peft.disable_adapter():
                    yield
            else:
                yield
        finally:
            self.model.train(was_training)

    def merged_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, fp32 tensor) of every parameter with the adapters merged: ``base + B @ A * scaling`` for the
        adapted layers, the base weight (as stored) elsewhere; tied weights once."""
        layers = self._lora_layers()
        for name, p in self.model.named_parameters():
            if ".lora_" in name:
                continue
            if ".base_layer." not in name:
                yield name, p.detach()
                continue
            owner, _, leaf = name.rpartition(".base_layer.")
            t = p.detach().float()
            if leaf == "weight":
                t = t + layers[owner].get_delta_weight(ADAPTER).detach().float()
            yield f"{owner}.{leaf}", t

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """:meth:`merged_weights` in fp32 plus the model's persistent buffers, as plain HF names."""
        sd = {n: t.float() for n, t in self.merged_weights()}
        persistent = set(self.model.state_dict())
        for name, b in self.model.named_buffers():
            if name in persistent:
                sd[name.replace(".base_layer.", ".")] = b.detach()
        return sd

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.peft, adapter_name=ADAPTER)

    def adapter_payload(self):
        """The adapter alone, as a weight sync carries it (``slick.weights.lora_sync.AdapterPayload``: PEFT's config
        and fp32 ``lora_A``/``lora_B`` tensors, detached copies)."""
        tensors = {n: t.detach().clone() for n, t in self.adapter_state_dict().items()}
        return AdapterPayload(peft_config_dict(self.peft.peft_config[ADAPTER]), tensors)

    def save_adapter(self, out_dir) -> None:
        """PEFT's adapter directory (``adapter_config.json``, ``adapter_model.safetensors``, fp32)."""
        self.peft.save_pretrained(str(out_dir), selected_adapters=[ADAPTER])

    def load_adapter(self, in_dir) -> None:
        """Copy the adapter weights of a directory :meth:`save_adapter` wrote into this policy's adapters (same
        rank and targets, else ValueError naming the directory)."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        d = Path(in_dir)
        conf = read_adapter_config(d)
        if int(conf["r"]) != self.spec.rank or float(conf.get("lora_alpha") or 0) != self.spec.alpha:
            raise ValueError(f"{d}: adapter has rank {conf['r']}, alpha {conf.get('lora_alpha')}; this run trains "
                             f"rank {self.spec.rank}, alpha {self.spec.alpha:g}")
        check_adapter_files(d, self.spec.rank, self.model)
        sd = load_file(str(d / ADAPTER_WEIGHTS))
        want = self.adapter_state_dict()
        if set(sd) != set(want):
            raise ValueError(f"{d}: adapter weights do not match this run's adapters (e.g. "
                             f"{sorted(set(sd) ^ set(want))[:3]}); same --lora-target-modules?")
        result = set_peft_model_state_dict(self.peft, sd, adapter_name=ADAPTER)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{d}: unexpected adapter weights {result.unexpected_keys[:3]}")


def attach_lora(model: nn.Module, cfg: Config | ConfigView, where: str = "the model") -> Optional[PolicyLora]:
    """:class:`PolicyLora` on ``model`` when the config asks for LoRA, else None."""
    spec = spec_from_config(cfg)
    return None if spec is None else PolicyLora(model, spec, where)



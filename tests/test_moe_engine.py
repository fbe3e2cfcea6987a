"""Mixture-of-experts models in the engine (Mixtral, Qwen3-MoE) against HF transformers' reference models (fp32)."""
import json

import pytest
import torch

from slick.engine.arch import ArchConfig
from slick.engine.local import LocalEngine
from slick.engine.model import Transformer
from slick.types import SamplingParams
from tests.test_engine_local import PROMPTS, hf_greedy, hf_logprobs, run

BOUND = 1e-4   # fp32: max |engine logit - HF logit| (differences are summation order only)

CASES = {   # name: (arch, config overrides)
    "mixtral": ("mixtral", {}),
    "qwen3_moe_norm": ("qwen3_moe", {}),
    "qwen3_moe_raw_sparse": ("qwen3_moe", {"norm_topk_prob": False, "decoder_sparse_step": 2,
                                           "num_hidden_layers": 4, "mlp_only_layers": [3]}),
}


def spiky_moe(tmp_path, case, seed=0, **extra):
    """A tiny MoE of ``CASES[case]`` with weights re-drawn large (std 0.25, as ``make_spiky_model``) so that
    greedy outputs vary and tokens spread over the experts; returns (dir, HF model)."""
    from transformers import AutoModelForCausalLM

    from slick.models.tiny import make_tiny_model

    arch, over = CASES[case]
    over = {**over, **extra}
    d = make_tiny_model(tmp_path / case, arch=arch, seed=seed, num_layers=over.pop("num_hidden_layers", 2), **over)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.25 if p.dim() >= 2 else
                    1.0 + torch.randn(p.shape, generator=g) * 0.1)
    m.save_pretrained(d)
    return d, m


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_forward_equals_hf(tmp_path, case):
    d, m = spiky_moe(tmp_path, case)
    cfg = ArchConfig.from_dir(d)
    if case == "qwen3_moe_raw_sparse":
        assert cfg.moe.layers == (1,) and not cfg.moe.normalize   # layer 3 is in mlp_only_layers, 0 and 2 are dense
    else:
        assert cfg.moe.layers == tuple(range(cfg.num_layers)) and cfg.moe.normalize
    model = Transformer.load(d, torch.float32, torch.device("cpu"))
    from slick.engine.kvcache import KVCache
    ids = torch.randint(0, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = m(ids).logits
    for b in range(2):
        cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"), 4, 64)
        cache.ensure(1, 64)
        for t in range(1, 24):   # the last-position logits of every prefix
            got = model.prefill(ids[b:b + 1, :t], torch.tensor([t]), torch.tensor([0]), cache)
            assert (got[0] - ref[b, t - 1]).abs().max().item() < BOUND, (case, b, t)


@pytest.mark.parametrize("case", sorted(CASES))
def test_engine_generation_with_kv_cache_matches_hf_no_cache_forward(tmp_path, case):
    d, m = spiky_moe(tmp_path, case)
    eng = LocalEngine(d, dtype="fp32")
    try:
        eng.eos_ids = []
        for text in PROMPTS[:3]:
            prompt = eng.tokenizer.encode(text)
            g = run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20, stop_token_ids=[])))
            assert g.token_ids == hf_greedy(m, prompt, 20), (case, text)
            assert len(set(g.token_ids)) > 3
            lp = hf_logprobs(m, prompt, g.token_ids, 1.0)   # one forward over the whole sequence, no cache
            assert (torch.tensor(g.logprobs) - lp).abs().max().item() < BOUND
    finally:
        eng.close_sync()


def test_routing_differs_between_tokens(tmp_path):
    """The check above is not trivially one expert: tokens of the spiky model go to every expert."""
    d, m = spiky_moe(tmp_path, "mixtral")
    model = Transformer.load(d, torch.float32, torch.device("cpu"))
    from slick.algo.routing import route
    h = torch.randn(64, model.cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    _, ids = route(h @ model.layers[0].moe.router.t(), 2, True)
    assert set(ids.view(-1).tolist()) == {0, 1, 2, 3}


def test_update_with_trainer_names_equals_hf(tmp_path):
    """A weight update in HF's in-memory names (``mlp.experts.gate_up_proj``, what a trainer sends) lands."""
    d, m = spiky_moe(tmp_path, "mixtral")
    eng = LocalEngine(d, dtype="fp32")
    try:
        with torch.no_grad():
            for p in m.parameters():
                p.mul_(1.1)
        run(eng.update_weights(named_tensors=list(m.named_parameters())))
        eng.eos_ids = []
        prompt = eng.tokenizer.encode(PROMPTS[1])
        g = run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[])))
        assert g.token_ids == hf_greedy(m, prompt, 12)
    finally:
        eng.close_sync()


@pytest.mark.parametrize("mt,field,value", [
    ("qwen3_moe", "shared_expert_intermediate_size", 64),
    ("mixtral", "router_jitter_noise", 0.1),
    ("qwen3_moe", "num_experts_per_tok", 0),
])
def test_unsupported_moe_variant_refused_naming_the_field(tmp_path, mt, field, value):
    c = {"model_type": mt, "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
         "intermediate_size": 16, "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2,
         "moe_intermediate_size": 8, field: value}
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(ValueError, match=field):
        ArchConfig.from_dir(tmp_path)


@pytest.mark.parametrize("mt", ["qwen2_moe", "deepseek_v3"])
def test_other_moe_architectures_refused_by_model_type(mt):
    with pytest.raises(ValueError, match=f"model_type='{mt}' is not supported"):
        ArchConfig.from_dict({"model_type": mt})

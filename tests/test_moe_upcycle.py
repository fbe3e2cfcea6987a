"""Sparse upcycling (slick.models.upcycle): a dense llama model as a Mixtral MoE whose logits start equal to the
dense model's, in HF transformers and in slick's engine (fp32), and which routes every token somewhere."""
import json

import pytest
import torch

from slick.engine.arch import ArchConfig
from slick.engine.kvcache import KVCache
from slick.engine.model import Transformer
from slick.models.tiny import make_tiny_model
from slick.models.upcycle import upcycle_to_mixtral

BOUND = 2e-5   # fp32: max |upcycled logit - dense logit|; the top-k weights sum to 1 over identical experts


@pytest.fixture(scope="module")
def dense_and_moe(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("upcycle")
    dense = make_tiny_model(root / "dense", arch="llama", seed=2, initializer_range=0.2)
    moe = upcycle_to_mixtral(dense, root / "moe", experts=4, top_k=2, router_std=0.5, seed=1)
    load = lambda d: AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()   # noqa: E731
    return dense, moe, load(dense), load(moe)


def test_config_is_mixtral_with_the_dense_shapes(dense_and_moe):
    dense, moe, *_ = dense_and_moe
    d, m = (json.loads((p / "config.json").read_text()) for p in (dense, moe))
    assert m["model_type"] == "mixtral" and (m["num_local_experts"], m["num_experts_per_tok"]) == (4, 2)
    for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "tie_word_embeddings"):
        assert m[k] == d[k], k


def test_upcycled_logits_equal_the_dense_models(dense_and_moe):
    *_, dense_m, moe_m = dense_and_moe
    ids = torch.randint(0, dense_m.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = dense_m(ids).logits, moe_m(ids).logits
    assert (a - b).abs().max().item() < BOUND
    # the router is not degenerate: its top-2 differs across tokens (all 4 experts get tokens in layer 0)
    with torch.no_grad():
        h = moe_m.model.embed_tokens(ids).reshape(-1, moe_m.config.hidden_size)
        h = moe_m.model.layers[0].post_attention_layernorm(h)
        top = torch.topk(torch.nn.functional.linear(h, moe_m.model.layers[0].mlp.gate.weight), 2).indices
    assert set(top.flatten().tolist()) == {0, 1, 2, 3}


def test_slick_engine_runs_the_upcycled_model_as_the_dense_one(dense_and_moe):
    dense, moe, dense_m, _ = dense_and_moe
    ids = torch.randint(0, dense_m.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    out = {}
    for name, d in (("dense", dense), ("moe", moe)):
        cfg = ArchConfig.from_dir(d)
        model = Transformer.load(d, torch.float32, torch.device("cpu"))
        cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"), 4, 64)
        cache.ensure(1, 64)
        with torch.no_grad():
            out[name] = model.prefill(ids, torch.tensor([12]), torch.tensor([0]), cache)
    assert ArchConfig.from_dir(moe).moe is not None
    assert (out["dense"] - out["moe"]).abs().max().item() < BOUND


def test_bad_requests_are_refused(tmp_path, dense_and_moe):
    dense, moe, *_ = dense_and_moe
    with pytest.raises(ValueError, match="top_k <= experts"):
        upcycle_to_mixtral(dense, tmp_path / "x", experts=2, top_k=3)
    with pytest.raises(ValueError, match="model_type is 'mixtral'"):
        upcycle_to_mixtral(moe, tmp_path / "y")

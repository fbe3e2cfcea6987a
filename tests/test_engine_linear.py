"""slick.engine.linear: the oneDNN packed path agrees with plain torch, and the engine is right on both."""
import asyncio

import pytest
import torch
import torch.nn.functional as F

import slick.engine.model as model_mod
from slick.engine.linear import Dense, can_pack
from slick.engine.local import LocalEngine
from slick.types import SamplingParams

from .test_engine_local import PROMPTS, hf_greedy, hf_logprobs, make_spiky_model

needs_pack = pytest.mark.skipif(not can_pack(torch.device("cpu"), torch.float32),
                                reason="oneDNN packed linears unavailable on this torch build")
# the engine dtype whose linears pack here: bf16 where the CPU has bf16 oneDNN (avx512_bf16/AMX), fp32 elsewhere
PACKED_DTYPE = "bf16" if can_pack(torch.device("cpu"), torch.bfloat16) else "fp32"


@needs_pack
@pytest.mark.parametrize("bias", [False, True])
def test_packed_ops_equal_plain_ops(bias):
    g = torch.Generator().manual_seed(0)
    w_t = torch.randn(24, 40, generator=g)
    b = torch.randn(40, generator=g) if bias else None
    x = torch.randn(2, 5, 24, generator=g)
    other = torch.randn(2, 5, 40, generator=g)
    plain, packed = Dense(w_t, b, pack=False), Dense(w_t, b, pack=True)
    assert packed.packed is None           # nothing is packed before repack()
    packed.repack()
    ref = x @ w_t + (0 if b is None else b)
    for p in (plain, packed):
        assert torch.allclose(p(x), ref, atol=1e-5)
        assert torch.allclose(p.silu(x), F.silu(ref), atol=1e-5)
        assert torch.allclose(p.mul(x, other), ref * other, atol=1e-5)
        assert torch.allclose(p.add(x, other), ref + other, atol=1e-5)
    w_t.mul_(2)                            # the packed copy is stale until repack()
    assert not torch.allclose(packed(x), 2 * ref - (0 if b is None else b), atol=1e-3)
    packed.repack()
    assert torch.allclose(packed(x), x @ w_t + (0 if b is None else b), atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_engine_matches_hf_with_and_without_packing(tmp_path, monkeypatch, packed):
    if packed and not can_pack(torch.device("cpu"), torch.float32):
        pytest.skip("oneDNN packed linears unavailable on this torch build")
    monkeypatch.setattr(model_mod, "can_pack", lambda device, dtype: packed)
    d, m = make_spiky_model(tmp_path / "qwen2", "qwen2")      # qwen2: q/k/v biases go through the ops too
    eng = LocalEngine(d, dtype="fp32")
    try:
        assert eng.model.packed is packed
        assert all((op.packed is not None) == (packed and op is not L.gu)
                   for L in eng.model.layers for op in (L.qkv, L.o, L.gu, L.gate, L.up, L.down))
        prompt = eng.tokenizer.encode(PROMPTS[0])
        eng.eos_ids = []
        g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=16, stop_token_ids=[])))
        assert g.token_ids == hf_greedy(m, prompt, 16)
        assert torch.allclose(torch.tensor(g.logprobs), hf_logprobs(m, prompt, g.token_ids, 1.0), atol=1e-4)
    finally:
        eng.close_sync()


def test_bf16_engine_close_to_hf_bf16(tmp_path):
    """The bf16 path (packed on CPUs with oneDNN) stays within bf16 rounding of HF's bf16 forward."""
    from transformers import AutoModelForCausalLM

    d, _ = make_spiky_model(tmp_path / "llama", "llama")
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    eng = LocalEngine(d, dtype="bf16")
    try:
        prompt = eng.tokenizer.encode(PROMPTS[2])
        g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=12, seed=3)))
        ref = hf_logprobs(m, prompt, g.token_ids, 1.0)
        err = (torch.tensor(g.logprobs) - ref).abs()
        assert err.mean() < 0.05 and err.max() < 0.2, err
    finally:
        eng.close_sync()


@needs_pack
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_packed_engine_keeps_one_copy_and_updates_exactly(tmp_path, tied):
    """Packed, the engine drops its plain weight copies; a full and a partial update land exactly (the
    partial one reads the untouched columns back out of the packed copies)."""
    from transformers import AutoModelForCausalLM

    from slick.models.tiny import make_tiny_model

    d = make_tiny_model(tmp_path / "a", arch="qwen2", tie_word_embeddings=tied, seed=1)
    m2 = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "b", arch="qwen2",
                                                              tie_word_embeddings=tied, seed=2))
    eng = LocalEngine(d, dtype=PACKED_DTYPE)
    try:
        model = eng.model
        assert model.packed
        for L in model.layers:                       # only the packed copies are left
            assert L.qkv_w is L.o_w is L.gu_w is L.down_w is None
            assert all(op.w_t is None for op in (L.qkv, L.o, L.gu, L.gate, L.up, L.down))
        assert (model.lm_head_t is None) is (not tied)
        assert "model.layers.0.self_attn.q_proj.weight" not in model.targets
        assert model.shapes["model.layers.0.self_attn.k_proj.weight"] == tuple(
            m2.model.layers[0].self_attn.k_proj.weight.shape)

        def weights():   # every linear weight read back from the packed ops, as HF names and shapes
            out = {}
            for i, L in enumerate(model.layers):
                qkv, gate, up = L.qkv.unpacked(), L.gate.unpacked(), L.up.unpacked()
                q = model.cfg.num_heads * model.cfg.head_dim
                k = model.cfg.num_kv_heads * model.cfg.head_dim
                p = f"model.layers.{i}."
                out[p + "self_attn.q_proj.weight"] = qkv[:, :q].t()
                out[p + "self_attn.k_proj.weight"] = qkv[:, q:q + k].t()
                out[p + "self_attn.v_proj.weight"] = qkv[:, q + k:].t()
                out[p + "self_attn.o_proj.weight"] = L.o.unpacked().t()
                out[p + "mlp.gate_proj.weight"] = gate.t()
                out[p + "mlp.up_proj.weight"] = up.t()
                out[p + "mlp.down_proj.weight"] = L.down.unpacked().t()
            out["lm_head.weight"] = model.head.unpacked().t()
            return out

        old = weights()
        wdtype = torch.bfloat16 if PACKED_DTYPE == "bf16" else torch.float32
        new = {n: t.to(wdtype) for n, t in m2.state_dict().items()}
        if tied:
            new["lm_head.weight"] = new["model.embed_tokens.weight"]
        partial = ["model.layers.1.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight"]
        eng.update_weights_sync(named_tensors=[(n, m2.state_dict()[n]) for n in partial])
        got = weights()
        for n in old:
            assert torch.equal(got[n], new[n] if n in partial else old[n]), n
        for L in model.layers:                       # dropped again after the update
            assert L.qkv_w is L.gu_w is None
        eng.update_weights_sync(named_tensors=m2.state_dict().items())
        got = weights()
        for n in old:
            assert torch.equal(got[n], new[n]), n
    finally:
        eng.close_sync()


@needs_pack
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_released_engine_refuses_work_until_a_full_update_restores_it(tmp_path, tied):
    """release_memory frees the KV cache and every packed copy (the bytes it reports are exactly theirs);
    generating and a partial update are refused with the engine unchanged; a full update brings back the same
    greedy tokens and logprobs, bit for bit."""
    from slick.engine.weight_check import WeightUpdateError
    from slick.models.tiny import make_tiny_model

    d = make_tiny_model(tmp_path / "a", arch="qwen2", tie_word_embeddings=tied, seed=1)
    eng = LocalEngine(d, dtype=PACKED_DTYPE)
    sp = SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=[], ignore_eos=True)
    prompt = eng.tokenizer.encode(PROMPTS[0])

    async def main():
        g0 = await eng.generate(prompt, sp)
        ops = [op for op in eng.model.dense_ops() if op.packed is not None]
        assert len(ops) == 5 * len(eng.model.layers) + 1        # qkv, o, gate, up, down; the head
        expect = eng.cache.nbytes() + sum(op.packed.numel() * op.packed.element_size() for op in ops)
        assert eng.cache.nbytes() > 0
        assert await eng.release_memory() == expect
        assert eng.cache.nbytes() == 0 and all(op.packed is None for op in ops)
        assert await eng.release_memory() == 0                  # nothing left to free
        with pytest.raises(RuntimeError, match="weights are released"):
            await eng.generate(prompt, sp)
        with pytest.raises(WeightUpdateError, match="lacks .* released"):
            await eng.update_weights(named_tensors=[("model.layers.0.mlp.up_proj.weight",
                                                     torch.zeros(eng.model.shapes["model.layers.0.mlp.up_proj.weight"]))])
        assert eng.model.released and await eng.get_weight_version() == 0
        shapes = eng.model.shapes          # the model itself refuses too (the engine checks before it copies)
        from safetensors.torch import load_file
        every = load_file(str(d / "model.safetensors"))
        with pytest.raises(ValueError, match="'model.layers.0.mlp.up_proj.weight' is not in this update"):
            eng.model.copy_named([(n, t) for n, t in every.items() if n != "model.layers.0.mlp.up_proj.weight"])
        with pytest.raises(ValueError, match="'model.layers.0.self_attn.q_proj.weight' is not in this update"):
            eng.model.copy_named([("model.norm.weight", torch.ones(shapes["model.norm.weight"]))])
        assert eng.model.released
        assert await eng.update_weights(path=str(d)) == 1       # every weight from the checkpoint again
        g1 = await eng.generate(prompt, sp)
        assert g1.token_ids == g0.token_ids and g1.logprobs == g0.logprobs

        task = asyncio.ensure_future(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=200,
                                                                         ignore_eos=True)))
        for _ in range(100):
            if eng.progress():
                break
            await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="1 request.* running or queued"):
            await eng.release_memory()
        await eng.abort_all()
        await task
        assert not eng.model.released

    try:
        asyncio.run(main())
    finally:
        eng.close_sync()

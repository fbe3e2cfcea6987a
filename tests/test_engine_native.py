"""slick.engine.native: the C++ decode kernels agree with the pure-torch path they replace.

The kernel tests run twice: on the library built for this CPU (AVX-512 paths where present) and on one built
for plain x86-64-v2, which takes the generic loops that machines without AVX-512 run.
"""
import asyncio
import ctypes
import os
import platform
import shutil

import pytest
import torch
import torch.nn.functional as F

import slick.engine.model as model_mod
from slick.engine import native
from slick.engine.local import LocalEngine
from slick.types import SamplingParams

from .native_required import require
from .stats import assert_frequencies
from .test_engine_local import PROMPTS, hf_greedy, hf_logprobs, make_spiky_model

K = native.load()


def skip_without_kernels():
    require(K, "native kernels")


@pytest.fixture(scope="module", params=["native", "generic"])
def kern(request):
    skip_without_kernels()
    if request.param == "native":
        return K
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the generic build targets x86-64")
    cxx = os.environ.get("CXX") or "c++"
    return native.NativeKernels(ctypes.CDLL(str(native.build(shutil.which(cxx) or cxx, march="x86-64-v2"))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_torch(kern, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(70, 96, generator=g) * 3).to(dtype)   # 70 rows: the threaded branch
    w = (1 + torch.randn(96, generator=g) * 0.1).to(dtype)
    ref = (F.rms_norm(x.float(), (96,), None, 1e-6).to(dtype) * w)       # HF order: cast, then scale
    for rows in (x, x[:5], x[:, :].t().contiguous().t()[:3]):            # also a row-strided view
        got = kern.rmsnorm(rows, w, 1e-6)
        want = ref[:rows.shape[0]]
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)


def torch_decode_attention(qkv, nh, nkv, cos, sin, pos, kc, vc):
    """Reference: RoPE, KV write and attention written with torch ops (what model.decode does without C++)."""
    B, _, hd = qkv.shape
    out = []
    for b in range(B):
        p = int(pos[b])
        x = qkv[b].float()
        qk = x[:nh + nkv] * cos[p].float() + x[:nh + nkv].roll(hd // 2, -1) * sin[p].float()
        kc[b, :, p] = qk[nh:].to(kc.dtype)
        vc[b, :, p] = qkv[b, nh + nkv:]
        q = qk[:nh].to(qkv.dtype).float().view(nkv, nh // nkv, hd)
        a = F.scaled_dot_product_attention(q, kc[b, :, :p + 1].float(), vc[b, :, :p + 1].float())
        out.append(a.reshape(-1))
    return torch.stack(out)


@pytest.mark.parametrize("dtype,hd,nh,nkv", [(torch.float32, 64, 9, 3), (torch.float32, 32, 4, 4),
                                            (torch.bfloat16, 64, 9, 3), (torch.float32, 128, 8, 2)])
def test_decode_attention_matches_torch(kern, dtype, hd, nh, nkv):
    g = torch.Generator().manual_seed(1)
    B, cap = 5, 300
    pos = torch.tensor([0, 7, 130, 299, 64])                  # 130 and 299 span several 128-position chunks
    qkv = torch.randn(B, nh + 2 * nkv, hd, generator=g).to(dtype)
    ang = torch.randn(cap, hd // 2, generator=g)
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(dtype)
    sin = torch.cat([-ang.sin(), ang.sin()], -1).to(dtype)
    kc = torch.randn(B + 2, nkv, cap, hd, generator=g).to(dtype)
    vc = torch.randn(B + 2, nkv, cap, hd, generator=g).to(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    got = kern.decode_attention(qkv, nh, nkv, cos, sin, pos, kc, vc)
    want = torch_decode_attention(qkv, nh, nkv, cos, sin, pos, kc2, vc2)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got.float(), want, atol=tol, rtol=tol), (got.float() - want).abs().max()
    written = torch.zeros(kc.shape[0], kc.shape[2], dtype=torch.bool)
    written[torch.arange(B), pos] = True
    for a, b in ((kc, kc2), (vc, vc2)):
        assert torch.equal(a.transpose(1, 2)[~written], b.transpose(1, 2)[~written])   # nothing else touched
        assert torch.allclose(a.transpose(1, 2)[written].float(), b.transpose(1, 2)[written].float(),
                              atol=tol, rtol=tol)


@pytest.mark.parametrize("use_native", [False, True])
def test_engine_matches_hf_with_and_without_native(tmp_path, monkeypatch, use_native):
    if use_native:
        skip_without_kernels()
    monkeypatch.setattr(model_mod.native, "load", lambda: K if use_native else None)
    d, m = make_spiky_model(tmp_path / "llama", "llama")
    eng = LocalEngine(d, dtype="fp32")
    try:
        assert (eng.model.native is not None) is use_native
        eng.eos_ids = []
        for text in PROMPTS[:2]:
            prompt = eng.tokenizer.encode(text)
            g = asyncio.run(eng.generate(prompt, SamplingParams(temperature=0, max_new_tokens=20, stop_token_ids=[])))
            assert g.token_ids == hf_greedy(m, prompt, 20)
            assert torch.allclose(torch.tensor(g.logprobs), hf_logprobs(m, prompt, g.token_ids, 1.0), atol=1e-4)
    finally:
        eng.close_sync()


def test_disabled_by_env_and_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("SLICK_NATIVE", "0")
    assert native.load() is None
    monkeypatch.setenv("SLICK_CACHE", str(tmp_path))
    assert native.cache_dir() == tmp_path / "native"


def gens(n, seed=0):
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampler_agrees_with_torch_path(kern, dtype):
    from slick.engine.sampling import sample

    torch.manual_seed(0)
    logits = (torch.randn(8, 1001) * 3).to(dtype)           # V not a multiple of 16: the tail block
    temps = [1.0, 0, 0.7, 1.3, 1.0, 0.5, 0, 2.0]
    args = (temps, [1.0] * 8, [-1] * 8)
    tok_t, lp_t = sample(logits, *args, gens(8, seed=5))
    tok_n, lp_n = sample(logits, *args, gens(8, seed=5), native=kern)
    assert tok_n == tok_t
    assert torch.allclose(torch.tensor(lp_n), torch.tensor(lp_t), atol=1e-5)
    # hand-computed: greedy picks the first maximum; logprob under T=1
    tok, lp = sample(torch.tensor([[0.0, 2.0, 2.0, 1.0]]), [0], [1.0], [-1], gens(1), native=kern)
    assert tok == [1] and abs(lp[0] - (2 - torch.logsumexp(torch.tensor([0.0, 2, 2, 1]), 0).item())) < 1e-6


def test_sampler_frequencies_and_truncation_fallback(kern):
    """Chi-square goodness of fit at alpha = 1e-4 (tests/stats.py), 4000 draws per case."""
    from slick.engine.sampling import sample

    p = torch.tensor([0.5, 0.3, 0.15, 0.05] + [0.0] * 20)
    n = 4000
    logits = p.log().repeat(n, 1)                            # -inf logits: never sampled
    tok, lp = sample(logits, [1.0] * n, [1.0] * n, [-1] * n, gens(n, seed=11), native=kern)
    assert_frequencies(tok, p)
    assert torch.allclose(torch.tensor(lp), p[tok].log(), atol=1e-5)
    # T=0.5 (still the native path): softmax(log p / 0.5) is p^2 renormalised
    tok, _ = sample(logits, [0.5] * n, [1.0] * n, [-1] * n, gens(n, seed=15), native=kern)
    assert_frequencies(tok, p ** 2 / (p ** 2).sum())
    # a row with top_k makes the batch take the torch path: top_k=2 keeps only {0, 1}, renormalised
    tok, _ = sample(logits, [1.0] * n, [1.0] * n, [2] * n, gens(n, seed=12), native=kern)
    assert_frequencies(tok, [0.625, 0.375] + [0.0] * 22)


@pytest.mark.parametrize("batch", [1, 3, 8, 13])
def test_decode_rows_rounded_up_give_bitwise_the_same_logits_and_cache(tmp_path, monkeypatch, batch):
    """_decode_native runs its matmuls on the batch rounded up to DECODE_ROWS rows (one oneDNN primitive per
    bucket, not per batch size): the real rows' logits and KV cache entries equal those of the unrounded run."""
    skip_without_kernels()
    from slick.engine.kvcache import KVCache
    d, _ = make_spiky_model(tmp_path / "llama", "llama")
    m = model_mod.Transformer.load(d, torch.bfloat16, torch.device("cpu"))
    from slick.engine.linear import can_pack
    assert m.native_attention                                          # the native decode
    # packed oneDNN matmuls where the CPU has bf16 (avx512_bf16/AMX); plain torch.mm rows on an AVX2-only CPU
    assert (m.layers[0].qkv.packed is not None) == can_pack(torch.device("cpu"), torch.bfloat16)
    g = torch.Generator().manual_seed(batch)
    tokens = torch.randint(0, m.cfg.vocab_size, (batch,), generator=g)
    pos = torch.randint(0, 40, (batch,), generator=g)

    def decode(rows_multiple):
        monkeypatch.setattr(model_mod, "DECODE_ROWS", rows_multiple)
        torch.manual_seed(0)
        cache = KVCache(m.cfg.num_layers, m.cfg.num_kv_heads, m.cfg.head_dim, torch.bfloat16, torch.device("cpu"),
                        max_slots=16, max_len=64)
        cache.ensure(batch, 64)
        for t in cache.k + cache.v:
            t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(1)))
        return m.decode(tokens, pos, cache, 64), cache

    (plain, c1), (rounded, c2) = decode(1), decode(model_mod.DECODE_ROWS)
    assert rounded.shape == plain.shape == (batch, m.cfg.vocab_size)
    assert torch.equal(rounded, plain)
    assert all(torch.equal(a, b) for a, b in zip(c1.k + c1.v, c2.k + c2.v))

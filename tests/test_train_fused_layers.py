"""The fused decoder layers (slick/train/fused_layers.py) against finite differences and the HF layers.

Tolerances: the autograd nodes are checked by ``torch.autograd.gradcheck`` in float64 (its defaults: eps 1e-6,
atol 1e-5, rtol 1e-3), so their backward is the exact derivative of their forward. Whole models, fp32: the
same maths in another order, so logprobs and entropy within 1e-5 (relative to the largest entry when above 1) and every gradient within 1e-4 of its
largest entry. bf16 (autocast and bf16 weights): both paths round differently, so each is compared with the
fp32 reference; the fused path's error (relative L2 over all gradients, and mean |logprob difference|) may be
at most 1.5x the HF path's error plus 1e-3 (measured on SmolLM2-135M, 64 samples: 6.2e-2 vs 5.9e-2).
"""
import pytest
import torch

from slick.models.tiny import make_tiny_model
from slick.train.attention import Segments
from slick.train.casts import cached_weight_casts, cast_cat
from slick.train.fused_layers import (AttentionBlock, AttentionSpec, MLPBlock, fusable, fuse_decoder_layers,
                                      mlp_backward, mlp_forward,
                                      rope, rope_backward)
from slick.train.fsdp import decoder_layers
from slick.train.trainer import Trainer
from tests.test_train import make_cfg
from tests.test_train_shared_prompts import grouped_samples
from tests.batches import batch_of

# a prompt [0, 4) shared by two responses, then a sequence of its own: query rows of each segment
SPANS = [(0, 0, 0, 4), (0, 4, 4, 7), (0, 4, 7, 9), (0, 0, 9, 12)]
N = 12


def _cos_sin(n, d, dtype):
    pos = torch.tensor([0, 1, 2, 3, 4, 5, 6, 4, 5, 0, 1, 2], dtype=dtype)[:n]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=dtype) / d))
    ang = torch.outer(pos, inv)
    ang = torch.cat([ang, ang], -1)
    return ang.cos().unsqueeze(1), ang.sin().unsqueeze(1)


@pytest.mark.parametrize("kv_heads,qk_norm,bias", [(2, False, False), (4, True, False), (1, False, True)])
def test_attention_block_gradcheck(kv_heads, qk_norm, bias):
    torch.manual_seed(0)
    dt, hidden, H, D = torch.float64, 12, 4, 4
    cos, sin = _cos_sin(N, D, dt)
    spec = AttentionSpec(H, kv_heads, D, 1e-6, D ** -0.5, Segments.build(SPANS, N), cos, sin, dt, qk_norm,
                         bias, bias)
    r = lambda *s: torch.randn(*s, dtype=dt, requires_grad=True)  # noqa: E731
    params = [r(hidden), r(H * D, hidden), r(kv_heads * D, hidden), r(kv_heads * D, hidden)]
    if bias:
        params += [r(H * D), r(kv_heads * D), r(kv_heads * D)]
    if qk_norm:
        params += [r(D), r(D)]
    params.append(r(hidden, H * D))
    if bias:
        params.append(r(hidden))
    x = r(N, hidden)
    assert torch.autograd.gradcheck(lambda x, *p: AttentionBlock.apply(x, spec, *p), (x, *params))


@pytest.mark.parametrize("recompute", [False, True])
def test_mlp_block_gradcheck(recompute):
    torch.manual_seed(1)
    dt = torch.float64
    r = lambda *s: torch.randn(*s, dtype=dt, requires_grad=True)  # noqa: E731
    x, a, ln, wg, wu, wd = r(N, 6), r(N, 6), r(6), r(10, 6), r(10, 6), r(6, 10)
    assert torch.autograd.gradcheck(lambda *t: MLPBlock.apply(t[0], t[1], 1e-6, dt, recompute, *t[2:]),
                                    (x, a, ln, wg, wu, wd))


@pytest.mark.parametrize("recompute", [False, True])
def test_mlp_block_equals_the_two_residual_additions_bitwise(recompute):
    """Under autocast's dtypes (fp32 residual, bf16 attention output and matmuls): ``MLPBlock(x, a)`` gives the
    values and gradients of ``h = x + a`` done by autograd before a node that saves ``h``, bit for bit, while
    saving ``a`` (bf16) instead of ``h`` (fp32)."""
    torch.manual_seed(3)
    bf = torch.bfloat16
    x0, a0 = torch.randn(N, 16), torch.randn(N, 16).to(bf)
    ws = [torch.randn(16) * 0.1 + 1, torch.randn(24, 16) * 0.2, torch.randn(24, 16) * 0.2, torch.randn(16, 24) * 0.2]
    g = torch.randn(N, 16)

    class MLPOnly(torch.autograd.Function):   # the MLP alone, saving its input h: the residual additions outside
        @staticmethod
        def forward(ctx, h, *w):
            y, r, gu = mlp_forward(h, 1e-6, bf, *w)
            ctx.save_for_backward(h, r, None if recompute else gu, *w)
            return y

        @staticmethod
        def backward(ctx, dy):
            h, r, gu, *w = ctx.saved_tensors
            dh, *grads = mlp_backward(h, r, gu, dy, 1e-6, bf, *w)
            return (dh.to(h.dtype), *grads)

    def two_additions(x, a, *w):   # by autograd, the residual stream saved in fp32 between them
        h = x + a
        return h + MLPOnly.apply(h, *w)

    def run(fn):
        leaves = [t.clone().requires_grad_(True) for t in (x0, a0, *ws)]
        out = fn(*leaves)
        out.backward(g)
        return [out.detach()] + [t.grad for t in leaves]

    fused = run(lambda x, a, *w: MLPBlock.apply(x, a, 1e-6, bf, recompute, *w))
    ref = run(two_additions)
    assert fused[2].dtype == bf and fused[1].dtype == torch.float32
    for got, want in zip(fused, ref):   # the output, d x, d a and the weights' gradients
        assert torch.equal(got, want)


def test_rope_backward_is_the_transpose():
    torch.manual_seed(2)
    cos, sin = _cos_sin(N, 8, torch.float64)
    x, g = torch.randn(N, 3, 8, dtype=torch.float64), torch.randn(N, 3, 8, dtype=torch.float64)
    # <rope(x), g> == <x, rope^T(g)> for every x, g
    assert torch.allclose((rope(x, cos, sin) * g).sum(), (x * rope_backward(g, cos, sin)).sum(), atol=1e-12)


def _grads(model_dir, dtype, fused, samples, precision=None):
    kw = dict(dtype=dtype, micro_batch_size=len(samples), rollout_temperature=0.8, disable_fused_layers=not fused)
    if precision:
        kw["train_precision"] = precision
    tr = Trainer(make_cfg(model_dir, **kw))
    assert tr.fused_layers == (0 if not fused else len(decoder_layers(tr.model)))
    mb = tr._pack(samples, list(range(len(samples))))
    assert mb.attention()[1] is not None      # the segment path (where the fused layers run)
    tr.model.zero_grad(set_to_none=True)
    with tr._cast_once():
        lps, ents = tr._forward(tr._fwd, mb, True, True)
        lp, ent = torch.cat(lps), torch.cat(ents)
        g = torch.Generator().manual_seed(3)
        w1, w2 = torch.randn(lp.shape, generator=g), torch.randn(lp.shape, generator=g)
        w1[::3] = 0.0                          # loss-mask zeros
        ((w1 * lp).sum() + 0.1 * (w2 * ent).sum()).backward()
    return lp.detach().float(), ent.detach().float(), {n: p.grad.float().clone() for n, p in tr.model.named_parameters()}


@pytest.fixture(scope="module")
def arch_dirs(tmp_path_factory):
    out = {}
    for arch, kw in (("llama", {}), ("qwen2", {}), ("qwen3", {}), ("mistral", {})):
        out[arch] = make_tiny_model(tmp_path_factory.mktemp(arch), arch=arch, hidden_size=64, num_layers=2,
                                    num_heads=4, num_kv_heads=2, intermediate_size=96, seed=5, **kw)
    return out


def _samples():
    samples = grouped_samples(groups=3, n=4, seed=4)
    return samples


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_fused_model_equals_hf_fp32(arch_dirs, arch):
    samples = _samples()
    ref = _grads(arch_dirs[arch], "fp32", False, samples)
    got = _grads(arch_dirs[arch], "fp32", True, samples)
    for a, b in zip(got[:2], ref[:2]):    # logprobs, entropy
        assert (a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max()))
    assert ref[2].keys() == got[2].keys()
    for n in ref[2]:
        scale = ref[2][n].abs().max()
        assert (got[2][n] - ref[2][n]).abs().max() <= 1e-4 * scale + 1e-7, n


@pytest.mark.parametrize("precision", ["autocast", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_model_bf16_as_accurate_as_hf(arch_dirs, arch, precision):
    samples = _samples()
    ref = _grads(arch_dirs[arch], "fp32", False, samples)

    def err(res):
        d = torch.cat([(res[2][n] - ref[2][n]).flatten() for n in ref[2]])
        full = torch.cat([ref[2][n].flatten() for n in ref[2]])
        return float((res[0] - ref[0]).abs().mean()), float(d.norm() / full.norm())

    hf = err(_grads(arch_dirs[arch], "bf16", False, samples, precision))
    fused = err(_grads(arch_dirs[arch], "bf16", True, samples, precision))
    assert hf[1] > 1e-4                        # bf16 really rounds (the comparison is not vacuous)
    assert fused[0] <= 1.5 * hf[0] + 1e-3, (fused, hf)
    assert fused[1] <= 1.5 * hf[1] + 1e-3, (fused, hf)


@pytest.mark.parametrize("recompute", [False, True])
def test_saved_activation_bytes_per_layer(arch_dirs, recompute):
    """Exactly what the docstring of fused_layers promises: the layer input in fp32; qkv, the attention output
    before and after o_proj and (unless the MLP recomputes it) gate/up in bf16; an RMSNorm scale per row for each
    of the two norms; and one log-sum-exp per (segment, head, query slot)."""
    tr = Trainer(make_cfg(arch_dirs["llama"], dtype="bf16", micro_batch_size=12, recompute_mlp=recompute))
    layer = decoder_layers(tr.model)[0]
    seg = Segments.build(SPANS, N)
    x = torch.randn(1, N, 64, requires_grad=True)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 4, 5, 0, 1, 2]])
    pe = tr.model.model.rotary_emb(x, pos)
    seen = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x, attention_mask=seg.mask, position_ids=pos, position_embeddings=pe, slick_segments=seg)
    S, Lq = seg.q_index.shape
    hid, H, KVH, D, inter = 64, 4, 2, 16, 96
    expect = (N * hid * 4 + N * hid * 2 + 2 * N * 4 + N * (H + 2 * KVH) * D * 2 + N * H * D * 2 + S * H * Lq * 4
              + (0 if recompute else N * 2 * inter * 2))
    assert sum(seen.values()) == expect
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_plain_calls_and_unsupported_layers_run_hf(arch_dirs, tmp_path):
    """Without segments (a plain ``model(input_ids)``) a fused layer runs the HF forward: identical logits; a
    layer the nodes do not cover (an MLP with biases) is left alone."""
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(arch_dirs["llama"])
    b = AutoModelForCausalLM.from_pretrained(arch_dirs["llama"])
    assert fuse_decoder_layers(decoder_layers(b)) == 2 and fuse_decoder_layers(decoder_layers(b)) == 0
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)
    biased = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "mb", mlp_bias=True))
    assert not fusable(decoder_layers(biased)[0]) and fuse_decoder_layers(decoder_layers(biased)) == 0


def test_weights_concatenated_once_per_block():
    a, b = torch.randn(3, 4), torch.randn(2, 4)
    with cached_weight_casts():
        one = cast_cat([a, b], torch.bfloat16)
        assert cast_cat([a, b], torch.bfloat16) is one
        assert cast_cat([a, b], torch.bfloat16, cache=False) is not one
        assert torch.equal(one, torch.cat([a, b]).bfloat16())
    assert cast_cat([a, b], torch.bfloat16) is not one


def test_recompute_mlp_gives_the_same_step_and_keeps_no_gate_up(tiny_model_dir):
    """--recompute-mlp: bitwise the same gradients and weights; no [tokens, 2 x intermediate] tensor is saved."""
    from slick.config.config import ConfigError
    from slick.train.trainer import Trainer
    from tests.test_train import simple_loss

    samples = _samples()
    adv = [torch.linspace(-1, 1, len(s.response_ids)) for s in samples]
    inter = None
    out = {}
    for recompute in (False, True):
        tr = Trainer(make_cfg(tiny_model_dir, dtype="bf16", recompute_mlp=recompute, micro_batch_size=len(samples)))
        assert tr.fused_layers == 2
        inter = tr.model.config.intermediate_size
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
            tr.train_step(batch_of(samples, adv), simple_loss)
        out[recompute] = ({n: w.clone() for n, w in tr.named_weights()}, saved)
    (w_keep, saved_keep), (w_re, saved_re) = out[False], out[True]
    for n, w in w_keep.items():
        assert torch.equal(w, w_re[n]), n
    gate_up = [s for s in saved_keep if len(s) == 2 and s[1] == 2 * inter]
    assert len(gate_up) == 2                         # one per decoder layer of the tiny model
    assert not [s for s in saved_re if len(s) == 2 and s[1] == 2 * inter]
    with pytest.raises(ConfigError, match="--recompute-mlp recomputes inside slick's fused decoder layers"):
        make_cfg(tiny_model_dir, recompute_mlp=True, disable_fused_layers=True)


def _transformers_future_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning) and "transformers" in w.filename]


def test_fused_layers_pass_the_cache_arguments_as_given(arch_dirs):
    """A fused layer hands the HF forward the cache arguments the model passed (transformers 5.x calls its layers
    with ``cache=``): no ``Both past_key_values and cache are set`` FutureWarning on a plain forward, generation
    with a KV cache, or a trainer step (the warning `make demo` printed in its progress bar)."""
    import warnings

    from transformers import AutoModelForCausalLM

    from slick.train.fused_layers import _kv_cache

    assert _kv_cache({"cache": "c"}) == "c" and _kv_cache({"past_key_values": "p"}) == "p"
    assert _kv_cache({"cache": None, "past_key_values": None}) is None
    model = AutoModelForCausalLM.from_pretrained(arch_dirs["llama"])
    assert fuse_decoder_layers(decoder_layers(model)) == 2
    ids = torch.tensor([[5, 9, 200, 31, 7]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(input_ids=ids)
        model.generate(ids, max_new_tokens=3, do_sample=False, attention_mask=torch.ones_like(ids))
        _grads(arch_dirs["llama"], "fp32", True, _samples())
    assert _transformers_future_warnings(caught) == []

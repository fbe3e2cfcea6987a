"""Decoder layers as two autograd nodes each, saving ~3x fewer activation bytes than the HF modules.

A HF Llama-family layer run under autograd saves, per token, every intermediate of its small ops: the fp32
RMSNorm steps, a bf16 cast of the normed input per projection, the gate, up, SiLU and product of the MLP,
the rotated q and k, and the gathered queries, keys, values and fp32 softmax of attention: ~45 KB per token
per layer for SmolLM2 under autocast. :func:`fuse_decoder_layers` gives each supported layer a forward made of
two :class:`torch.autograd.Function` nodes with their own backward:

* :class:`AttentionBlock`: ``RMSNorm -> one qkv matmul -> (q/k RMSNorm) -> RoPE -> segment attention ->
  o_proj``. Saves the layer input, the qkv matmul output, the attention output and one log-sum-exp per
  query row; backward recomputes the norm, RoPE and the attention probabilities.
* :class:`MLPBlock`: ``the residual addition after attention -> RMSNorm -> one gate/up matmul -> silu(gate) * up
  -> down -> the residual addition``. Saves the layer input (already saved by the attention block), the
  attention block's output and the gate/up output; backward recomputes the addition, the norm and the product.

That is ~13 KB per token per layer for SmolLM2 under autocast (the residual stream once in fp32; qkv, the
attention output twice -- before and after ``o_proj`` -- and gate/up in the matmul dtype). The q/k/v and gate/up
weights are concatenated (and cast) at every use, freed with the layer (``slick.train.casts``, ``cache=False``), so
each block runs one large matmul instead of three or two small ones.

The maths and dtypes follow the HF modules (RMSNorm in fp32 and ``weight * normed.to(input dtype)``,
rotate-half RoPE, ``softmax`` of fp32 scores, ``silu(gate) * up`` in the matmul dtype); the only differences
are roundings (RoPE is computed in fp32 and rounded once). ``tests/test_train_fused_layers.py`` checks each
node against finite differences in float64 and whole models against the HF forward/backward.

A fused layer runs only where the trainer's packed segments are given (``slick_segments``); any other call
(a plain ``model(input_ids)``, a KV cache, attention dropout in training, long segments off the CPU) runs the
layer's own HF forward.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from slick.fastmath import exp_, logsumexp
from slick.train.attention import Segments
from slick.train.casts import cast_cat
from slick.train import native_fused
from slick.train.logprobs import _matmul_dtype
from slick.train.native_fused import NativeFused

FUSED_LAYERS = ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer")


# ---------------------------------------------------------------------------------------------- pure maths
def _acc(dt: torch.dtype) -> torch.dtype:
    """The accumulation dtype: fp32, or fp64 for fp64 inputs (the gradient checks)."""
    return torch.float64 if dt == torch.float64 else torch.float32


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float):
    """HF's RMSNorm: ``(w * (x * r).to(x.dtype), r)`` with ``r = rsqrt(mean(x^2) + eps)`` in fp32 (last dim)."""
    xa = x.to(_acc(x.dtype))
    r = torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)
    return w * (xa * r).to(x.dtype), r


def rms_norm_to(x: torch.Tensor, w: torch.Tensor, eps: float, dt: torch.dtype):
    """:func:`rms_norm` with its output in the matmul dtype ``dt``: ``(n in dt, r)``; one native pass where the
    kernel applies (``slick.train.native_fused``)."""
    if (k := native_fused.get_if(NativeFused.norm_applies(x, w, dt))) is not None:
        return k.norm_forward(x, w, eps)
    n, r = rms_norm(x, w, eps)
    return n.to(dt), r


def rms_norm_backward(x: torch.Tensor, w: torch.Tensor, r: torch.Tensor, dy: torch.Tensor):
    """``(dx, dw)`` of :func:`rms_norm` (fp32; roundings are treated as identities, as autograd does); one
    native pass for an fp32 ``x`` and a bf16 ``dy`` where the kernel applies (``slick.train.native_fused``)."""
    if (k := native_fused.get_if(NativeFused.norm_applies(x, w, dy.dtype))) is not None:
        return k.norm_backward(x, w, r, dy)
    xhat = x.to(r.dtype) * r
    dxhat = dy.to(r.dtype) * w.to(r.dtype)
    dx = r * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    dw = (dy.to(r.dtype) * xhat).reshape(-1, x.shape[-1]).sum(0)
    return dx, dw


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x [N, heads, D]`` with ``cos``/``sin [N, 1, D]``, in ``cos``'s dtype."""
    x = x.to(cos.dtype)
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def rope_to(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """``rope(x, cos, sin).to(dt)``; one native pass where the kernel applies (``slick.train.native_fused``)."""
    applies = dt == x.dtype == torch.bfloat16 and NativeFused.rope_applies(x, cos, sin)
    if (k := native_fused.get_if(applies)) is not None:
        return k.rope_forward(x, cos, sin)
    return rope(x, cos, sin).to(dt)


def rope_backward(g: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The transpose of :func:`rope` applied to ``g``: ``g * cos + rotate_half^T(g * sin)`` (one native pass for a
    contiguous fp32 ``g`` where the kernel applies)."""
    applies = g.dtype == torch.float32 and g.is_contiguous() and NativeFused.rope_applies(g, cos, sin)
    if (k := native_fused.get_if(applies)) is not None:
        return k.rope_backward(g, cos, sin)
    gs = g * sin
    h = g.shape[-1] // 2
    return g * cos + torch.cat((gs[..., h:], -gs[..., :h]), -1)


def _gather_qkv(q_index, k_index, q, k, v, kvh: int):
    """Per block: queries ``[S, KVH, r*Lq, D]`` (the r query heads of a kv head stacked), keys and values
    ``[S, KVH, Lk, D]``, from ``[N, heads, D]`` rows."""
    S, Lq = q_index.shape
    Lk = k_index.shape[1]
    H, D = q.shape[1], q.shape[2]
    r = H // kvh
    Q = q.index_select(0, q_index.reshape(-1)).view(S, Lq, kvh, r, D).permute(0, 2, 3, 1, 4)
    K = k.index_select(0, k_index.reshape(-1)).view(S, Lk, kvh, D).transpose(1, 2)
    V = v.index_select(0, k_index.reshape(-1)).view(S, Lk, kvh, D).transpose(1, 2)
    return Q.reshape(S, kvh, r * Lq, D), K, V


def _probs_scores(mask, Q, K, scale: float, acc: torch.dtype):
    """fp32 masked scores ``[S, KVH, r, Lq, Lk]`` of gathered ``Q``, ``K``."""
    S, kvh, rLq, _ = Q.shape
    Lq, Lk = mask.shape[2], K.shape[2]
    s = torch.matmul(Q, K.transpose(-1, -2)).to(acc).mul_(scale).view(S, kvh, rLq // Lq, Lq, Lk)
    return s.masked_fill_(~mask.view(S, 1, 1, Lq, Lk), float("-inf"))


def segment_attention(seg: Segments, q, k, v, scale: float):
    """Attention over packed segments (``slick.train.attention``): ``q [N, H, D]``, ``k``/``v [N, KVH, D]`` in
    the matmul dtype -> ``(out [N, H*D], lse)``. The short blocks at once (scores and softmax in fp32), then each
    long segment by torch's causal flash kernel; ``lse``: their log-sum-exps flattened and concatenated."""
    N, H, D = q.shape
    kvh = k.shape[1]
    outs, lses = [], []
    if seg.q_index.shape[0]:
        S, Lq = seg.q_index.shape
        Q, K, V = _gather_qkv(seg.q_index, seg.k_index, q, k, v, kvh)
        s = _probs_scores(seg.mask, Q, K, scale, _acc(q.dtype))
        lse = logsumexp(s, -1, keepdim=True)
        p = exp_(s.sub_(lse)).to(v.dtype).view(S, kvh, -1, K.shape[2])
        del s
        outs.append(torch.matmul(p, V).view(S, kvh, H // kvh, Lq, D).permute(0, 3, 1, 2, 4).reshape(S * Lq, H * D))
        lses.append(lse.reshape(-1))
    for j, (_, P, _, _) in enumerate(seg.long):
        Q, K, V = _long_qkv(seg.long_rows(j), q, k, v)
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(Q, K, V, 0.0, True, scale=scale)
        outs.append(o[0, :, P:].transpose(0, 1).reshape(-1, H * D))
        lses.append(lse.reshape(-1))
    out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return out.index_select(0, seg.out_index), (lses[0] if len(lses) == 1 else torch.cat(lses))


def _long_qkv(rows, q, k, v):
    """A long segment's queries, keys and values ``[1, H, rows, D]`` (kv heads repeated for grouped-query
    attention), contiguous as torch's flash kernel wants them."""
    H, kvh = q.shape[1], k.shape[1]
    Q = q.index_select(0, rows).transpose(0, 1).unsqueeze(0).contiguous()
    K = k.index_select(0, rows).transpose(0, 1).repeat_interleave(H // kvh, 0).unsqueeze(0).contiguous()
    V = v.index_select(0, rows).transpose(0, 1).repeat_interleave(H // kvh, 0).unsqueeze(0).contiguous()
    return Q, K, V


def _heads_first(x: torch.Tensor, H: int) -> torch.Tensor:
    """``[rows, H*D] -> [1, H, rows, D]``, contiguous."""
    return x.view(x.shape[0], H, -1).transpose(0, 1).unsqueeze(0).contiguous()


def segment_attention_backward(seg: Segments, q, k, v, scale: float, lse, out, dout):
    """``(dq, dk, dv)`` (fp32, shapes of ``q``, ``k``, ``v``) of :func:`segment_attention` given its output ``out``
    and ``dout [N, H*D]``: the short blocks' probabilities recomputed from their log-sum-exp, each long segment by
    torch's flash kernel's backward (its prompt rows' outputs are dropped: their gradient is zero, and so is what
    their outputs add)."""
    N, H, D = q.shape
    kvh = k.shape[1]
    r = H // kvh
    acc = _acc(q.dtype)
    do_all = q.new_zeros(seg.slots, H * D).index_copy_(0, seg.out_index, dout.to(q.dtype))
    dqs = []
    dk = q.new_zeros(N, kvh, D, dtype=acc)
    dv = q.new_zeros(N, kvh, D, dtype=acc)
    row = at = 0
    if seg.q_index.shape[0]:
        S, Lq = seg.q_index.shape
        Lk = seg.k_index.shape[1]
        Q, K, V = _gather_qkv(seg.q_index, seg.k_index, q, k, v, kvh)
        at = S * kvh * r * Lq
        p = exp_(_probs_scores(seg.mask, Q, K, scale, acc).sub_(lse[:at].view(S, kvh, r, Lq, 1)))
        row = S * Lq
        do = do_all[:row].view(S, Lq, kvh, r, D).permute(0, 2, 3, 1, 4).reshape(S, kvh, r * Lq, D)
        pv = p.to(v.dtype).view(S, kvh, r * Lq, Lk)
        dV = torch.matmul(pv.transpose(-1, -2), do)                                  # [S, KVH, Lk, D]
        dp = torch.matmul(do, V.transpose(-1, -2)).to(acc).view_as(p)
        ds = dp.sub_((p * dp).sum(-1, keepdim=True)).mul_(p).mul_(scale).to(q.dtype).view(S, kvh, r * Lq, Lk)
        del p, pv, dp
        dqs.append(torch.matmul(ds, K).view(S, kvh, r, Lq, D).permute(0, 3, 1, 2, 4).reshape(S * Lq, H, D))
        dK = torch.matmul(ds.transpose(-1, -2), Q)                                   # [S, KVH, Lk, D]
        k_rows = seg.k_index.reshape(-1)
        dk.index_add_(0, k_rows, dK.transpose(1, 2).reshape(S * Lk, kvh, D).to(acc))
        dv.index_add_(0, k_rows, dV.transpose(1, 2).reshape(S * Lk, kvh, D).to(acc))
    for j, (_, P, s0, s1) in enumerate(seg.long):
        rows, L = seg.long_rows(j), s1 - s0
        Q, K, V = _long_qkv(rows, q, k, v)
        O = out.new_zeros(P + L, H * D)
        O[P:] = out[s0:s1]
        dO = q.new_zeros(P + L, H * D)
        dO[P:] = do_all[row:row + L]
        row += L
        lse_j = lse[at:at + H * (P + L)].view(1, H, P + L)
        at += H * (P + L)
        dQ, dK, dV = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            _heads_first(dO, H), Q, K, V, _heads_first(O, H), lse_j, 0.0, True, scale=scale)
        dqs.append(dQ[0, :, P:].transpose(0, 1))
        dk.index_add_(0, rows, dK[0].view(kvh, r, P + L, D).sum(1).transpose(0, 1).to(acc))
        dv.index_add_(0, rows, dV[0].view(kvh, r, P + L, D).sum(1).transpose(0, 1).to(acc))
    dq = (dqs[0] if len(dqs) == 1 else torch.cat(dqs)).index_select(0, seg.out_index).to(acc)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------- autograd nodes
@dataclass
class AttentionSpec:
    """What :class:`AttentionBlock` needs besides tensors with gradients."""
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    scale: float
    segments: Segments
    cos: torch.Tensor          # [N, 1, D]
    sin: torch.Tensor
    dtype: torch.dtype         # matmul dtype
    qk_norm: bool
    qkv_bias: bool
    o_bias: bool


def _mm_grad(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Weight gradient ``dy^T x`` of a linear layer."""
    return torch.mm(dy.t(), x)


def _unpack(spec: AttentionSpec, params):
    """``params`` in :class:`AttentionBlock`'s order -> ``(ln, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, bo)``,
    None where ``spec`` says a part is absent."""
    it = iter(params)
    ln_w, wq, wk, wv = next(it), next(it), next(it), next(it)
    bq, bk, bv = (next(it), next(it), next(it)) if spec.qkv_bias else (None, None, None)
    qn_w, kn_w = (next(it), next(it)) if spec.qk_norm else (None, None)
    wo = next(it)
    bo = next(it) if spec.o_bias else None
    return ln_w, wq, wk, wv, bq, bk, bv, qn_w, kn_w, wo, bo


class AttentionBlock(torch.autograd.Function):
    """``x [N, hidden] -> o_proj(attention(rope(qkv(rms_norm(x)))))`` in the matmul dtype.

    ``params``: input norm weight, q/k/v weights, (q/k/v biases), (q-norm, k-norm weights), o weight, (o bias)
    -- present as ``spec`` says."""

    @staticmethod
    def forward(ctx, x, spec: AttentionSpec, *params):
        ln_w, wq, wk, wv, bq, bk, bv, qn_w, kn_w, wo, bo = _unpack(spec, params)
        dt, H, K, D = spec.dtype, spec.heads, spec.kv_heads, spec.head_dim
        n, r = rms_norm_to(x, ln_w, spec.eps, dt)
        w_qkv = cast_cat([wq, wk, wv], dt, cache=False)
        b_qkv = cast_cat([bq, bk, bv], dt, cache=False) if spec.qkv_bias else None
        qkv = F.linear(n, w_qkv, b_qkv)
        q, k, v = _split_heads(qkv, H, K, D)
        rq = rk = None
        if spec.qk_norm:
            q, rq = rms_norm(q, qn_w, spec.eps)
            k, rk = rms_norm(k, kn_w, spec.eps)
        out, lse = segment_attention(spec.segments, rope_to(q, spec.cos, spec.sin, dt),
                                     rope_to(k, spec.cos, spec.sin, dt), v, spec.scale)
        y = F.linear(out, cast_cat([wo], dt, cache=False), cast_cat([bo], dt, cache=False) if bo is not None else None)
        ctx.spec = spec
        ctx.save_for_backward(x, r, qkv, out, lse, rq, rk, *params)
        return y

    @staticmethod
    def backward(ctx, dy):
        spec = ctx.spec
        x, r, qkv, out, lse, rq, rk, *params = ctx.saved_tensors
        ln_w, wq, wk, wv, bq, bk, bv, qn_w, kn_w, wo, bo = _unpack(spec, params)
        dt, H, K, D = spec.dtype, spec.heads, spec.kv_heads, spec.head_dim
        dy = dy.to(dt)
        g_wo = _mm_grad(dy, out).to(wo.dtype)
        g_bo = dy.to(_acc(dt)).sum(0).to(bo.dtype) if bo is not None else None
        dout = torch.mm(dy, cast_cat([wo], dt, cache=False))
        q0, k0, v = _split_heads(qkv, H, K, D)
        q, k = (rms_norm(q0, qn_w, spec.eps)[0], rms_norm(k0, kn_w, spec.eps)[0]) if spec.qk_norm else (q0, k0)
        cos, sin = spec.cos, spec.sin
        dq, dk, dv = segment_attention_backward(spec.segments, rope_to(q, cos, sin, dt), rope_to(k, cos, sin, dt),
                                                v, spec.scale, lse, out, dout)
        dq, dk = rope_backward(dq, cos, sin), rope_backward(dk, cos, sin)
        g_qn = g_kn = None
        if spec.qk_norm:
            dq, g_qn = rms_norm_backward(q0, qn_w, rq, dq)
            dk, g_kn = rms_norm_backward(k0, kn_w, rk, dk)
            g_qn, g_kn = g_qn.to(qn_w.dtype), g_kn.to(kn_w.dtype)
        N = x.shape[0]
        dqkv = torch.cat([dq.reshape(N, -1), dk.reshape(N, -1), dv.reshape(N, -1)], -1).to(dt)
        n = rms_norm_to(x, ln_w, spec.eps, dt)[0]
        dn = torch.mm(dqkv, cast_cat([wq, wk, wv], dt, cache=False))
        dx, g_ln = rms_norm_backward(x, ln_w, r, dn)
        sizes = [H * D, K * D, K * D]
        # one weight-gradient matmul per weight: a [3 heads' rows x N] @ [N x hidden] product of the concatenation
        # is slower than its parts on CPU (oneDNN, measured 1.3x for gate/up)
        grads = [g_ln.to(ln_w.dtype)] + [_mm_grad(d, n).to(w.dtype) for d, w in zip(dqkv.split(sizes, -1),
                                                                                     (wq, wk, wv))]
        if spec.qkv_bias:
            grads += [g.to(b.dtype) for g, b in zip(dqkv.to(_acc(dt)).sum(0).split(sizes), (bq, bk, bv))]
        if spec.qk_norm:
            grads += [g_qn, g_kn]
        grads.append(g_wo)
        if spec.o_bias:
            grads.append(g_bo)
        return (dx.to(x.dtype), None, *grads)


def _split_heads(qkv: torch.Tensor, H: int, K: int, D: int):
    N = qkv.shape[0]
    q, k, v = qkv.split([H * D, K * D, K * D], -1)
    return q.view(N, H, D), k.view(N, K, D), v.view(N, K, D)


class MLPBlock(torch.autograd.Function):
    """``(x, a) -> h + down(silu(gate(n)) * up(n))`` with ``h = x + a`` (the residual stream after attention:
    the layer input plus the attention block's output) and ``n = rms_norm(h)``; the MLP in the matmul dtype.

    It saves ``x``, which the attention block saves anyway, and ``a`` in the matmul dtype, instead of ``h`` in
    the residual dtype, and recomputes ``h = x + a`` in backward: the same addition on the same inputs, so the
    same values, at half the bytes of ``h`` under autocast. Backward hands ``x`` and ``a`` the gradients the two
    residual additions would (``dh``; ``dh`` cast to ``a``'s dtype). ``recompute``: keep only the norm's scale
    besides, and recompute the gate/up product in backward (the same matmul on the same inputs: bitwise the same
    values) -- ``--recompute-mlp``."""

    @staticmethod
    def forward(ctx, x, a, eps: float, dt: torch.dtype, recompute: bool, ln_w, wg, wu, wd):
        h = x + a
        y, r, gu = mlp_forward(h, eps, dt, ln_w, wg, wu, wd)
        ctx.args = (eps, dt, y.dtype)
        ctx.save_for_backward(x, a, r, None if recompute else gu, ln_w, wg, wu, wd)
        return h + y

    @staticmethod
    def backward(ctx, dout):
        eps, dt, y_dtype = ctx.args
        x, a, r, gu, ln_w, wg, wu, wd = ctx.saved_tensors
        h = x + a
        dx, *grads = mlp_backward(h, r, gu, dout.to(y_dtype), eps, dt, ln_w, wg, wu, wd)
        dh = dout + dx.to(h.dtype)
        return (dh.to(x.dtype), dh.to(a.dtype), None, None, None, *grads)


def mlp_forward(h, eps: float, dt: torch.dtype, ln_w, wg, wu, wd):
    """``(y, r, gu)``: the MLP's output ``down(silu(gate(n)) * up(n))`` with ``n = rms_norm(h)``, the norm's scale
    and the gate/up product, in the matmul dtype ``dt``."""
    n, r = rms_norm_to(h, ln_w, eps, dt)
    gu = F.linear(n, cast_cat([wg, wu], dt, cache=False))
    if (k := native_fused.get_if(NativeFused.swiglu_applies(gu))) is not None:
        hid = k.swiglu_forward(gu)
    else:
        g, u = gu.chunk(2, -1)
        hid = F.silu(g) * u
    return F.linear(hid, cast_cat([wd], dt, cache=False)), r, gu


def mlp_backward(h, r, gu, dy, eps: float, dt: torch.dtype, ln_w, wg, wu, wd):
    """``(dh, g_ln, g_wg, g_wu, g_wd)`` of :func:`mlp_forward` for the output gradient ``dy``; ``gu`` None:
    recomputed (the same matmul on the same inputs)."""
    n = rms_norm_to(h, ln_w, eps, dt)[0]
    if gu is None:
        gu = F.linear(n, cast_cat([wg, wu], dt, cache=False))
    dy = dy.to(dt)
    da = torch.mm(dy, cast_cat([wd], dt, cache=False))
    if (k := native_fused.get_if(NativeFused.swiglu_applies(gu))) is not None:
        hid, dgu = k.swiglu_backward(gu, da)    # one pass (slick.train.native_fused)
        dg, du = dgu.chunk(2, -1)
    else:
        g, u = gu.chunk(2, -1)
        sg = F.silu(g)
        hid = sg * u
        # in the matmul dtype, as autograd through the HF MLP computes it (silu_backward: fp32 inside)
        dgu = torch.empty_like(gu)
        dg, du = dgu.chunk(2, -1)
        torch.mul(da, sg, out=du)
        torch.mul(da, u, out=dg)
        torch.ops.aten.silu_backward.grad_input(dg, g, grad_input=dg)
    g_wd = _mm_grad(dy, hid).to(wd.dtype)
    dn = torch.mm(dgu, cast_cat([wg, wu], dt, cache=False))
    dh, g_ln = rms_norm_backward(h, ln_w, r, dn)
    g_wg, g_wu = _mm_grad(dg, n).to(wg.dtype), _mm_grad(du, n).to(wu.dtype)   # per weight, as in AttentionBlock
    return dh, g_ln.to(ln_w.dtype), g_wg, g_wu, g_wd


# ---------------------------------------------------------------------------------------------- the layers
def _kv_cache(kwargs: dict):
    """The KV cache a decoder layer was called with: ``cache`` (transformers >= 5.2x) or ``past_key_values``
    (its deprecated name, earlier 5.x), None when neither is set."""
    kv = kwargs.get("cache")
    return kv if kv is not None else kwargs.get("past_key_values")


def _fused_forward(self, hidden_states, attention_mask=None, position_ids=None, position_embeddings=None,
                   slick_segments: Optional[Segments] = None, **kwargs):
    # the cache arguments (cache / past_key_values, use_cache) stay in kwargs and reach the HF forward as the
    # model passed them: naming both makes transformers warn that past_key_values is deprecated
    attn, mlp = self.self_attn, self.mlp
    dropout = attn.attention_dropout if self.training else 0.0
    # long segments take torch's CPU flash kernel's own ops; elsewhere the HF layer's SDPA attends them
    elsewhere = bool(slick_segments is not None and slick_segments.long and hidden_states.device.type != "cpu")
    if (slick_segments is None or _kv_cache(kwargs) is not None or dropout or position_embeddings is None
            or hidden_states.shape[0] != 1 or elsewhere):
        return self._slick_hf_forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                      position_embeddings=position_embeddings, slick_segments=slick_segments,
                                      **kwargs)
    x = hidden_states[0]
    dt = _matmul_dtype(x, attn.q_proj.weight)
    cos, sin = (t[0].unsqueeze(1) for t in position_embeddings)
    acc = _acc(dt)
    D = attn.head_dim
    spec = AttentionSpec(attn.q_proj.out_features // D, attn.k_proj.out_features // D, D,
                         self.input_layernorm.variance_epsilon, attn.scaling, slick_segments,
                         cos.to(acc), sin.to(acc), dt, self._slick_qk_norm,
                         attn.q_proj.bias is not None, attn.o_proj.bias is not None)
    params = [self.input_layernorm.weight, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]
    if spec.qkv_bias:
        params += [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
    if spec.qk_norm:
        params += [attn.q_norm.weight, attn.k_norm.weight]
    params.append(attn.o_proj.weight)
    if spec.o_bias:
        params.append(attn.o_proj.bias)
    with torch.autocast(x.device.type, enabled=False):
        ln = self.post_attention_layernorm
        h = MLPBlock.apply(x, AttentionBlock.apply(x, spec, *params), ln.variance_epsilon, dt,
                           self._slick_recompute_mlp, ln.weight, mlp.gate_proj.weight, mlp.up_proj.weight,
                           mlp.down_proj.weight)
    return h.unsqueeze(0)


def fusable(layer: torch.nn.Module) -> bool:
    """True for a HF decoder layer of a supported class whose parts the fused nodes cover (SiLU MLP without
    biases; q/k/v with or without biases; Qwen3's q/k norms)."""
    if type(layer).__name__ not in FUSED_LAYERS:
        return False
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return False
    if any(getattr(mlp, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        return False
    act = getattr(attn.config, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        return False
    biases = [getattr(attn, n).bias is not None for n in ("q_proj", "k_proj", "v_proj")]
    if any(biases) and not all(biases):
        return False
    return hasattr(layer.input_layernorm, "variance_epsilon")


def fuse_decoder_layers(layers, recompute_mlp: bool = False) -> int:
    """Give every :func:`fusable` layer of ``layers`` the fused forward; returns how many were fused.
    ``recompute_mlp``: their MLP nodes recompute the gate/up product in backward (:class:`MLPBlock`)."""
    count = 0
    for layer in layers:
        if getattr(layer, "_slick_hf_forward", None) is not None or not fusable(layer):
            continue
        layer._slick_recompute_mlp = bool(recompute_mlp)
        layer._slick_hf_forward = layer.forward
        layer._slick_qk_norm = hasattr(layer.self_attn, "q_norm") and hasattr(layer.self_attn, "k_norm")
        layer.forward = types.MethodType(_fused_forward, layer)
        count += 1
    return count

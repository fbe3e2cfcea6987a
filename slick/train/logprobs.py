"""Token logprobs and entropy from hidden states, in chunks, so [tokens, vocab] fp32 logits never exist at once.

``logprob[t] = log softmax(logits[t] / temperature)[target[t]]`` and
``entropy[t] = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v`` with ``z = logits / temperature``,
computed in fp32 whatever the matmul dtype.

``chunked_logprobs`` runs the lm head and this math as one autograd node (:class:`FusedLogprobEntropy`):
its forward keeps two fp32 numbers per row (log-sum-exp and entropy; nothing of the logits), and its
backward recomputes one chunk's logits at a time and writes ``d loss / d logits`` in closed form::

    dz = g_lp * (onehot(target) - p) - g_ent * p * (log p + entropy)      # log p + entropy = z - E_p[z]

then a matmul gives the chunk's hidden-state gradient; ``d loss / d logits`` of up to ``WGRAD_ROWS`` positions
(whole chunks, in the matmul dtype) is kept so that one matmul per group adds the lm-head weight gradient (a
[vocab, hidden] product and its fp32 accumulation per chunk of 128 cost SmolLM2's backward over 2,000 positions
0.78 s against 0.52 s per group of 1,024). On the CPU with bf16 logits, a chunk's log-sum-exp, logprobs and
entropy, and its ``dz``, are each one native pass over its logits (``slick.train.native_fused``). Compared with
activation checkpointing of the plain ops, no softmax/log-softmax intermediates are saved, the chunk is not
re-run through autograd, and the weight is cast to the matmul dtype once per call, not once per chunk.
``logprobs_from_logits`` is the plain reference the tests compare against.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from slick.fastmath import exp, logsumexp
from slick.train import native_fused
from slick.train.casts import cast as _cast
from slick.train.native_fused import NativeFused

WGRAD_ROWS = 1024   # positions per lm-head weight-gradient matmul in backward (a [rows, vocab] buffer in bf16)


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                         with_entropy: bool = True, entropy_grad: bool = True,
                         softcap: Optional[float] = None):
    """Logprob of ``targets`` and entropy (or None) for logits ``[n, V]``; both fp32 ``[n]`` (reference path)."""
    z = logits.float()
    if softcap:
        z = torch.tanh(z / softcap) * softcap
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    lp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    ent = None
    if with_entropy:
        if entropy_grad:
            ent = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        else:
            with torch.no_grad():
                ent = lse.detach() - (torch.softmax(z.detach(), dim=-1) * z.detach()).sum(-1)
    return lp, ent


def _matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype F.linear would compute in here: autocast's when it is on for this device, else the weight's."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev) and torch.get_autocast_dtype(dev) is not None:
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _scaled_logits(h, w, b, temperature, softcap):
    """fp32 ``z = softcap(h @ w.T + b) / T`` for one chunk, and ``tanh(.)`` when soft-capped (for backward)."""
    z = F.linear(h, w, b).float()
    th = None
    if softcap:
        th = torch.tanh(z / softcap)
        z = th * softcap
    if temperature != 1.0:
        z = z.div_(temperature) if th is None else z / temperature
    return z, th


def _logit_gradient(hc, w, b, targets, lse, ent, g_lp, g_ent, temperature, softcap, out) -> None:
    """Write d loss / d logits of one chunk into ``out`` (its rows of the matmul-dtype buffer), recomputing the
    chunk's logits: ``dz = -p * (g_lp + g_ent * (z - E[z])) + g_lp * onehot(target)`` with ``z - E[z] = log p +
    entropy``, built in z's buffer (``g_lp`` / ``g_ent`` None: no such term; ``ent`` is read with ``g_ent``)."""
    z, th = _scaled_logits(hc, w, b, temperature, softcap)
    logp = z.sub_(lse.unsqueeze(-1))
    p = exp(logp)
    if g_ent is not None:
        logp.add_(ent.unsqueeze(-1)).mul_(g_ent.unsqueeze(-1))
        if g_lp is not None:
            logp.add_(g_lp.unsqueeze(-1))
        dz = logp.mul_(p).neg_()
    else:
        dz = p.mul_(g_lp.unsqueeze(-1)).neg_()
    del p
    if g_lp is not None:
        dz.scatter_add_(-1, targets.unsqueeze(-1), g_lp.unsqueeze(-1))
    if temperature != 1.0:
        dz.div_(temperature)
    if th is not None:
        dz.mul_(1.0 - th * th)
    out.copy_(dz)


class FusedLogprobEntropy(torch.autograd.Function):
    """``(hidden [n,H], weight [V,H], bias [V]|None, targets [n]) -> (logprob [n], entropy [n])``, fp32, chunked.

    ``with_entropy=False`` returns an empty entropy; ``entropy_grad=False`` makes entropy a constant (no
    gradient flows from it, and backward skips its term).
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy, entropy_grad, softcap):
        dt = _matmul_dtype(hidden, weight)
        h, w, b = hidden.to(dt), _cast(weight, dt), _cast(bias, dt)
        n = h.shape[0]
        lp = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty_like(lp)
        ent = torch.empty_like(lp) if with_entropy else None
        native = native_fused.get_if(NativeFused.logprob_applies(h, dt, softcap))
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, chunk_size):
                sl = slice(s, s + chunk_size)
                if native is not None:   # one pass over the bf16 logits (slick.train.native_fused)
                    native.logprob_forward(F.linear(h[sl], w, b), targets[sl], temperature, lse[sl], lp[sl],
                                           ent[sl] if with_entropy else None)
                    continue
                z, _ = _scaled_logits(h[sl], w, b, temperature, softcap)
                lse[sl] = logsumexp(z, dim=-1)
                logp = z.sub_(lse[sl].unsqueeze(-1))          # log p, in z's buffer
                lp[sl] = logp.gather(-1, targets[sl].unsqueeze(-1)).squeeze(-1)
                if with_entropy:   # -sum p log p: no cancellation of two large numbers (lse - E[z])
                    ent[sl] = torch.linalg.vecdot(exp(logp), logp).neg_()
                del z, logp
        if not with_entropy:
            ent = lp.new_zeros(0)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent if (with_entropy and entropy_grad) else None)
        ctx.args = (dt, temperature, chunk_size, softcap)
        if not (with_entropy and entropy_grad):
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        dt, temperature, chunk_size, softcap = ctx.args
        if ent is None:
            g_ent = None
        if g_lp is None and g_ent is None:
            return (None,) * 9
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        h, w, b = hidden.to(dt), _cast(weight, dt), _cast(bias, dt)
        n = h.shape[0]
        dh = torch.empty(n, h.shape[1], dtype=dt, device=h.device) if need_h else None
        dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        db = torch.zeros(w.shape[0], dtype=torch.float32, device=w.device) if need_b else None
        # d loss / d logits of up to `rows` positions (whole chunks) in the matmul dtype: one weight-gradient
        # matmul per group of chunks, not per chunk (each adds a [V, H] product into dw)
        rows = min(n, max(chunk_size, -(-WGRAD_ROWS // chunk_size) * chunk_size))
        dz_rows = torch.empty(rows, w.shape[0], dtype=dt, device=h.device)
        g0 = 0   # first position of the group in dz_rows
        native = native_fused.get_if(NativeFused.logprob_applies(h, dt, softcap))
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, n, chunk_size):
                sl = slice(s, s + chunk_size)
                hc = h[sl]
                dzc = dz_rows[s - g0:s - g0 + hc.shape[0]]
                if native is not None:   # d loss / d logits in one pass, into the group's rows
                    native.logprob_backward(F.linear(hc, w, b), targets[sl], temperature, lse[sl],
                                            None if g_ent is None else ent[sl], None if g_lp is None else g_lp[sl],
                                            None if g_ent is None else g_ent[sl], dzc)
                else:
                    _logit_gradient(hc, w, b, targets[sl], lse[sl], None if g_ent is None else ent[sl],
                                    None if g_lp is None else g_lp[sl], None if g_ent is None else g_ent[sl],
                                    temperature, softcap, dzc)
                if need_h:
                    torch.mm(dzc, w, out=dh[sl])
                if need_b:
                    db.add_(dzc.float().sum(0))
                end = s + hc.shape[0]
                if need_w and (end - g0 + chunk_size > rows or end == n):   # the group is full (or the last)
                    dw.add_(torch.mm(dz_rows[:end - g0].t(), h[g0:end]))
                if end - g0 + chunk_size > rows:
                    g0 = end
        del dz_rows
        return (dh.to(hidden.dtype) if need_h else None, dw.to(weight.dtype) if need_w else None,
                db.to(bias.dtype) if need_b else None, None, None, None, None, None, None)


def chunked_logprobs(hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor,
                     temperature: float = 1.0, chunk_size: int = 512, with_entropy: bool = True,
                     entropy_grad: bool = True, softcap: Optional[float] = None):
    """Logprobs ``[n]`` and entropy ``[n]`` (or None) of ``targets`` given hidden states ``[n, H]``.

    ``lm_head`` is the model's output projection (``model.get_output_embeddings()``); only these ``n``
    rows go through it, ``chunk_size`` rows at a time, in one :class:`FusedLogprobEntropy` node.
    """
    if chunk_size <= 0:
        raise ValueError(f"logprob_chunk_size must be positive (got {chunk_size})")
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    lp, ent = FusedLogprobEntropy.apply(hidden, weight, bias, targets, float(temperature), int(chunk_size),
                                        bool(with_entropy), bool(entropy_grad), softcap or None)
    return lp, (ent if with_entropy else None)

"""A functional decoder-only transformer over Hugging Face weights (Llama, Qwen2, Qwen3, Mistral; Mixtral and
Qwen3-MoE with their experts in ``slick.engine.moe``).

The weights are read straight from a HF directory (``config.json`` + ``*.safetensors``) into a few
fused tensors (one qkv matrix and one gate/up matrix per layer), and ``prefill`` / ``decode`` run the
forward pass against a :class:`~slick.engine.kvcache.KVCache` whose slots hold one sequence each.
No ``transformers`` module is called at generation time; the maths follows the HF reference models
(RMSNorm in fp32, rotate-half RoPE, grouped-query attention, SwiGLU MLP).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import torch
import torch.nn.functional as F

from slick.engine import native
from slick.engine.arch import ArchConfig
from slick.engine.kvcache import KVCache
from slick.engine.linear import Dense, can_pack
from slick.engine.moe import MoeBlock, RoutingRecorder

SKIPPED_SUFFIX = "rotary_emb.inv_freq"  # a buffer some HF checkpoints carry; the engine computes its own
DECODE_ROWS = 8   # the native decode's matmuls run on the batch rounded up to a multiple of this (_decode_native)


@dataclass
class _Raw:
    """A plain ``[in, out]`` weight matrix of the model that the forward only reads through packed copies.

    ``names``: the HF tensors it holds and ``ops`` the ops over it, each with its columns (``first, end``).
    Dropping it (:meth:`attach` ``None``) saves one bf16 copy of the model (~200 MB for SmolLM2-135M) in every
    engine.
    """

    owner: object
    attr: str
    shape: tuple
    names: list
    ops: list

    def attach(self, w: Optional[torch.Tensor]) -> None:
        """Install ``w`` (or None) as the matrix and as the ops' plain weights."""
        setattr(self.owner, self.attr, w)
        for op, a, b in self.ops:
            op.w_t = None if w is None else w[:, a:b]

    def fill_unwritten(self, written: set) -> None:
        """Columns of names not in ``written`` read back from the packed ops (a partial update)."""
        w = getattr(self.owner, self.attr)
        for name, a, b in self.names:
            if name in written:
                continue
            for op, oa, ob in self.ops:
                if op.packed is not None and oa <= a and b <= ob:
                    with torch.no_grad():
                        w[:, a:b].copy_(op.unpacked()[:, a - oa:b - oa])
                    break
            else:
                raise _not_restored(name)


def _not_restored(name: str) -> ValueError:
    return ValueError(f"weight {name!r} is not in this update and the engine released its copy "
                      "(release_weights): an update after a release must write every weight")


class Layer:
    """One decoder layer's weights (fused qkv and gate/up) and the :class:`Dense` ops over them."""

    __slots__ = ("in_norm", "qkv_w", "qkv_b", "q_norm", "k_norm", "o_w", "o_b", "post_norm",
                 "gu_w", "gu_b", "down_w", "down_b", "qkv", "o", "gu", "gate", "up", "down", "moe")

    def mlp_out(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``x + down(silu(gate(h)) * up(h))``: the SwiGLU MLP of the normed ``h`` with its residual (or the
        layer's experts: ``slick.engine.moe``)."""
        if self.moe is not None:
            return self.moe.out(h, x)
        if self.gate.packed is not None:        # silu and the product fused into the two matmuls
            return self.down.add(self.up.mul(h, self.gate.silu(h)), x)
        g, u = self.gu(h).chunk(2, dim=-1)
        return self.down.add(F.silu(g) * u, x)


class Transformer:
    """Weights plus the functional forward pass. Build with :meth:`load`."""

    def __init__(self, cfg: ArchConfig, dtype: torch.dtype, device: torch.device, bias_keys: set[str]):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        H, hd = cfg.hidden_size, cfg.head_dim
        e = lambda *s: torch.empty(*s, dtype=dtype, device=device)  # noqa: E731
        self.packed = can_pack(device, dtype)   # oneDNN pre-packed linears (see slick.engine.linear)
        self.native = None                      # C kernels for norm and decode attention (slick.engine.native)
        if device.type == "cpu" and dtype in native.NativeKernels.dtypes:
            self.native = native.load()
        self.native_attention = (self.native is not None and not cfg.qk_norm
                                 and self.native.supports_attention(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim))
        # Linear weights are stored transposed, [in, out], so the unpacked forward is a plain ``x @ w`` (faster
        # than F.linear's x @ W.T on CPU). A tied lm head is the transpose view of the embedding, which stays
        # row-contiguous: the per-step token lookup is then a cheap row gather.
        self.embed = e(cfg.vocab_size, H)
        self.lm_head_t = self.embed.t() if cfg.tie_word_embeddings else e(H, cfg.vocab_size)
        self.norm = e(H)
        self.layers: list[Layer] = []
        # packed linear weights whose plain copies are dropped once packed (see _release)
        self._raws: list[_Raw] = []
        self.aliases: set[str] = set()      # other names of weights in targets (an MoE's fused expert names)
        self.recorder = RoutingRecorder() if cfg.moe is not None else None   # the experts of the last forward
        # hf name -> a view of our storage with the HF tensor's shape (copy_ into it updates the weights)
        self.targets: dict[str, torch.Tensor] = {
            "model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm,
            "lm_head.weight": self.lm_head_t.t()}
        for i in range(cfg.num_layers):
            self.layers.append(self._make_layer(i, bias_keys, e))
        pk = self.packed
        self.head = Dense(self.lm_head_t, None, pk)
        if pk and not cfg.tie_word_embeddings:   # a tied head reads the embedding, which stays
            self._raws.append(_Raw(self, "lm_head_t", (H, cfg.vocab_size), [("lm_head.weight", 0, cfg.vocab_size)],
                                   [(self.head, 0, cfg.vocab_size)]))
        self._raw_of = {name: r for r in self._raws for name, _, _ in r.names}
        self.released = False      # release_weights() dropped the packed copies; a full update restores them
        self.shapes = {name: tuple(t.shape) for name, t in self.targets.items()}
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self._inv_freq = inv
        self._rope_len = 0
        self.cos = self.sin = None

    def _make_layer(self, i: int, bias_keys: set[str], e) -> Layer:
        """Layer ``i``'s weights (``e`` allocates), their HF-name views in ``self.targets`` and, when packed, the
        plain copies to drop once packed (``self._raws``)."""
        cfg = self.cfg
        H, hd, nh, nkv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        qd, kd = nh * hd, nkv * hd
        p = f"model.layers.{i}."
        L = Layer()
        L.in_norm, L.post_norm = e(H), e(H)
        L.qkv_w, L.o_w = e(H, qd + 2 * kd), e(qd, H)
        has = lambda n: (p + n) in bias_keys  # noqa: E731
        L.qkv_b = e(qd + 2 * kd) if has("self_attn.q_proj.bias") else None
        L.o_b = e(H) if has("self_attn.o_proj.bias") else None
        L.q_norm = e(hd) if cfg.qk_norm else None
        L.k_norm = e(hd) if cfg.qk_norm else None
        t = self.targets
        t[p + "input_layernorm.weight"] = L.in_norm
        t[p + "post_attention_layernorm.weight"] = L.post_norm
        for name, a, b in (("q_proj", 0, qd), ("k_proj", qd, qd + kd), ("v_proj", qd + kd, qd + 2 * kd)):
            t[p + f"self_attn.{name}.weight"] = L.qkv_w[:, a:b].t()
            if L.qkv_b is not None:
                t[p + f"self_attn.{name}.bias"] = L.qkv_b[a:b]
        t[p + "self_attn.o_proj.weight"] = L.o_w.t()
        if L.o_b is not None:
            t[p + "self_attn.o_proj.bias"] = L.o_b
        if cfg.qk_norm:
            t[p + "self_attn.q_norm.weight"] = L.q_norm
            t[p + "self_attn.k_norm.weight"] = L.k_norm
        pk = self.packed
        L.qkv, L.o = Dense(L.qkv_w, L.qkv_b, pk), Dense(L.o_w, L.o_b, pk)
        if pk:
            w = p + "self_attn.{}_proj.weight"
            self._raws += [
                _Raw(L, "qkv_w", (H, qd + 2 * kd), [(w.format("q"), 0, qd), (w.format("k"), qd, qd + kd),
                                                    (w.format("v"), qd + kd, qd + 2 * kd)],
                     [(L.qkv, 0, qd + 2 * kd)]),
                _Raw(L, "o_w", (qd, H), [(w.format("o"), 0, H)], [(L.o, 0, H)])]
        L.moe = None
        if cfg.moe is not None and i in cfg.moe.layers:
            L.moe = MoeBlock(cfg.moe, H, e, i, self.recorder)
            named, alias = L.moe.targets(p)
            t.update(named)
            self.aliases |= alias
            L.gu_w = L.gu_b = L.down_w = L.down_b = L.gu = L.gate = L.up = L.down = None
        else:
            self._make_mlp(L, p, has, e)
        return L

    def _make_mlp(self, L: Layer, p: str, has, e) -> None:
        """Layer ``L``'s dense SwiGLU MLP (fused gate/up), its HF-name views and, when packed, its plain copies."""
        H, inter, t, pk = self.cfg.hidden_size, self.cfg.intermediate_size, self.targets, self.packed
        L.gu_w, L.down_w = e(H, 2 * inter), e(inter, H)
        L.gu_b = e(2 * inter) if has("mlp.gate_proj.bias") else None
        L.down_b = e(H) if has("mlp.down_proj.bias") else None
        for name, a, b in (("gate_proj", 0, inter), ("up_proj", inter, 2 * inter)):
            t[p + f"mlp.{name}.weight"] = L.gu_w[:, a:b].t()
            if L.gu_b is not None:
                t[p + f"mlp.{name}.bias"] = L.gu_b[a:b]
        t[p + "mlp.down_proj.weight"] = L.down_w.t()
        if L.down_b is not None:
            t[p + "mlp.down_proj.bias"] = L.down_b
        L.down = Dense(L.down_w, L.down_b, pk)
        L.gu = Dense(L.gu_w, L.gu_b, False)          # one matmul on the plain path; split when packed
        gb, ub = (None, None) if L.gu_b is None else (L.gu_b[:inter], L.gu_b[inter:])
        L.gate, L.up = Dense(L.gu_w[:, :inter], gb, pk), Dense(L.gu_w[:, inter:], ub, pk)
        if pk:
            self._raws += [
                _Raw(L, "gu_w", (H, 2 * inter), [(p + "mlp.gate_proj.weight", 0, inter),
                                                 (p + "mlp.up_proj.weight", inter, 2 * inter)],
                     [(L.gu, 0, 2 * inter), (L.gate, 0, inter), (L.up, inter, 2 * inter)]),
                _Raw(L, "down_w", (inter, H), [(p + "mlp.down_proj.weight", 0, H)], [(L.down, 0, H)])]

    # ---------------------------------------------------------------- loading / weight updates
    @classmethod
    def load(cls, path: str | Path, dtype: torch.dtype, device: torch.device) -> "Transformer":
        """Read config and all safetensors of a HF directory."""
        path = Path(path)
        cfg = ArchConfig.from_dir(path)
        files = safetensor_files(path)
        from safetensors import safe_open

        keys: set[str] = set()
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                keys.update(h.keys())
        model = cls(cfg, dtype, device, {k for k in keys if k.endswith(".bias")})
        seen = model.copy_named(iter_safetensors(files), strict=False)
        required = set(model.targets) - model.aliases - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
        missing = sorted(required - seen)
        if missing:
            raise ValueError(f"{path}: weights missing from safetensors: {missing[:8]}"
                             f"{' ...' if len(missing) > 8 else ''}")
        return model

    def copy_named(self, named: Iterable[tuple[str, torch.Tensor]], strict: bool = True) -> set[str]:
        """Copy ``(hf_name, tensor)`` pairs into the weights (cast to the engine dtype); return names seen.

        Rotary buffers are ignored; an unknown name raises ``KeyError`` when ``strict``. A packed matrix is
        written through a plain copy made for the update (its parts that are not written are read back from the
        packed one), packed again and dropped.
        """
        seen = set()
        staged: dict[int, _Raw] = {}
        try:
            for name, tensor in named:
                if name.endswith(SKIPPED_SUFFIX):
                    continue
                raw = self._raw_of.get(name)
                if raw is not None and id(raw) not in staged:
                    self._stage(raw)
                    staged[id(raw)] = raw
                tgt = self.targets.get(name)
                if tgt is None:
                    if strict:
                        raise KeyError(f"unknown weight name {name!r} for a {self.cfg.model_type} model")
                    continue
                if tuple(tgt.shape) != tuple(tensor.shape):
                    raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} does not match "
                                     f"the model's {tuple(tgt.shape)}")
                with torch.no_grad():
                    tgt.copy_(tensor.detach())
                seen.add(name)
            if self.released and len(staged) < len(self._raws):
                lacking = next(n for r in self._raws if id(r) not in staged for n, _, _ in r.names)
                raise _not_restored(lacking)
            for raw in staged.values():
                raw.fill_unwritten(seen)
            if seen:
                self.repack()
                self.released = False
        finally:   # also on an error: the packed copies (old or new) stay the weights
            self._release()
        return seen

    def _stage(self, raw: "_Raw") -> None:
        """Give a packed matrix a plain copy again (uninitialised) and make its names writable. The copy is
        stored in HF's ``[out, in]`` layout (``w`` is its ``[in, out]`` transpose view): a HF tensor is then
        copied in row by row and the packing reads it as it is, with no transposing copy (a sync of
        SmolLM2-135M: 0.08 s instead of 0.18 s)."""
        w = torch.empty(raw.shape[::-1], dtype=self.dtype, device=self.device).t()
        raw.attach(w)
        for name, a, b in raw.names:
            self.targets[name] = w[:, a:b].t()

    def _release(self) -> None:
        """Drop the plain copies of packed matrices: the packed copy is the only one the forward reads."""
        for raw in self._raws:
            if getattr(raw.owner, raw.attr) is not None:
                raw.attach(None)
                for name, _, _ in raw.names:
                    self.targets.pop(name, None)

    def release_weights(self) -> int:
        """Drop the packed weight copies until the next update (which must then write every weight it
        dropped: :meth:`required_names`); returns the bytes freed. The forward refuses to run meanwhile.
        Without packing the plain matrices are the weights and stay (0 bytes freed)."""
        if not self.packed or self.released:
            return 0
        ops = [d for d in self.dense_ops() if d.packed is not None]
        freed = sum(d.packed.numel() * d.packed.element_size() for d in ops)
        for d in ops:
            d.packed = None
        self.released = True
        return freed

    def required_names(self) -> set[str]:
        """The weights an update must write: after :meth:`release_weights`, every packed matrix's; else none."""
        return {name for r in self._raws for name, _, _ in r.names} if self.released else set()

    def _check_loaded(self) -> None:
        if self.released:
            raise RuntimeError("the engine's weights are released (release_weights); update them before "
                               "running the model")

    def dense_ops(self) -> list[Dense]:
        """Every :class:`Dense` of the model."""
        return [d for L in self.layers for d in (L.qkv, L.o, L.gu, L.gate, L.up, L.down) if d is not None] + [self.head]

    def repack(self) -> None:
        """Refresh the packed weight copies after the weights changed (no-op without packing)."""
        if self.packed:
            with torch.no_grad():
                for d in self.dense_ops():
                    if d.w_t is not None:   # a dropped plain copy: its packed copy is current
                        d.repack()

    # ---------------------------------------------------------------- forward pieces
    def _ensure_rope(self, n: int) -> None:
        if n <= self._rope_len:
            return
        n = max(n, 2 * self._rope_len, 256)
        freqs = torch.outer(torch.arange(n, dtype=torch.float32), self._inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        half = emb.shape[-1] // 2
        sin = emb.sin()
        sin[:, :half] *= -1   # rotate_half(x) * sin == roll(x, half) * [-sin, sin]
        self.cos = emb.cos().to(self.dtype).to(self.device)
        self.sin_signed = sin.to(self.dtype).to(self.device)
        self._rope_len = n

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.native is not None:
            return self.native.rmsnorm(x, w, self.cfg.rms_eps)
        # one fused kernel; it accumulates in fp32 for bf16 inputs (HF rounds once more, before the
        # weight multiply: identical in fp32, within bf16 rounding otherwise)
        return F.rms_norm(x, (x.shape[-1],), w, self.cfg.rms_eps)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)

    def _qkv(self, L: Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B,T,H] -> q [B,nh,T,hd], k/v [B,nkv,T,hd] with RoPE (and q/k norm) applied."""
        c = self.cfg
        B, T, _ = x.shape
        nh, nkv, hd = c.num_heads, c.num_kv_heads, c.head_dim
        qkv = L.qkv(self._norm(x, L.in_norm)).view(B, T, nh + 2 * nkv, hd)
        v = qkv[:, :, nh + nkv:]
        if L.q_norm is not None:
            q = self._rope(self._norm(qkv[:, :, :nh], L.q_norm), cos, sin)
            k = self._rope(self._norm(qkv[:, :, nh:nh + nkv], L.k_norm), cos, sin)
        else:  # one RoPE call for q and k together
            qk = self._rope(qkv[:, :, :nh + nkv], cos, sin)
            q, k = qk[:, :, :nh], qk[:, :, nh:]
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _mlp_out(self, L: Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Attention output projection and the SwiGLU MLP, each with its residual connection."""
        x = L.o.add(attn, x)
        return L.mlp_out(self._norm(x, L.post_norm), x)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self._norm(h, self.norm))   # in the model dtype; the sampler reads it as is

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor, cache: KVCache,
                start: int = 0) -> torch.Tensor:
        """Run right-padded prompts ``tokens`` [u,P] (true lengths ``lens``) at positions ``start..``, write
        their keys/values into cache ``slots``; return logits [u,V] (model dtype) at each prompt's last token.

        ``start > 0``: positions ``0..start-1`` of every slot already hold a (shared) prefix in the cache, which
        the new tokens attend to; only the suffix is computed.
        """
        self._check_loaded()
        c = self.cfg
        u, P = tokens.shape
        self._ensure_rope(start + P)
        cos = self.cos[start:start + P].view(1, P, 1, -1)
        sin = self.sin_signed[start:start + P].view(1, P, 1, -1)
        mask = None
        if start:   # query j (position start+j) sees the prefix and the suffix up to itself
            dev = tokens.device
            mask = torch.arange(start + P, device=dev).view(1, -1) <= (start + torch.arange(P, device=dev)).view(-1, 1)
        x = F.embedding(tokens, self.embed)
        for i, L in enumerate(self.layers):
            q, k, v = self._qkv(L, x, cos, sin)
            cache.k[i][slots, :, start:start + P] = k
            cache.v[i][slots, :, start:start + P] = v
            if start:
                k, v = cache.k[i][slots, :, :start + P], cache.v[i][slots, :, :start + P]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=c.num_heads != c.num_kv_heads)
            x = self._mlp_out(L, x, a.transpose(1, 2).reshape(u, P, -1))
        last = x[torch.arange(u, device=x.device), lens - 1]
        return self._logits(last)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, max_len: int) -> torch.Tensor:
        """One decode step for the sequences in cache slots ``0..B-1``: ``tokens`` [B] sit at positions
        ``pos`` [B]; ``max_len`` = max(pos)+1. Returns logits [B,V] in the model dtype."""
        self._check_loaded()
        c = self.cfg
        B = tokens.shape[0]
        nkv, hd = c.num_kv_heads, c.head_dim
        g = c.num_heads // nkv
        dev = tokens.device
        self._ensure_rope(max_len)
        if self.native_attention:
            return self._decode_native(tokens, pos, cache)
        cos, sin = self.cos[pos].view(B, 1, 1, -1), self.sin_signed[pos].view(B, 1, 1, -1)
        allowed = torch.arange(max_len, device=dev).view(1, -1) <= pos.view(-1, 1)
        mask = torch.zeros(B, 1, 1, max_len, dtype=self.dtype, device=dev)
        mask.masked_fill_(~allowed.view(B, 1, 1, max_len), float("-inf"))
        # flat row of (slot b, head h, position pos[b]) in a [slots*nkv*capacity, hd] view of the cache
        rows = ((torch.arange(B, device=dev) * nkv).view(-1, 1) + torch.arange(nkv, device=dev).view(1, -1))
        rows = (rows * cache.capacity + pos.view(-1, 1)).view(-1)
        x = F.embedding(tokens.view(B, 1), self.embed)
        for i, L in enumerate(self.layers):
            q, k, v = self._qkv(L, x, cos, sin)
            kc, vc = cache.k[i], cache.v[i]
            kc.view(-1, hd).index_copy_(0, rows, k.reshape(B * nkv, hd))
            vc.view(-1, hd).index_copy_(0, rows, v.reshape(B * nkv, hd))
            # grouped-query attention without repeating K/V: the g query heads of one kv head act as
            # g query positions attending to that head's keys
            a = F.scaled_dot_product_attention(q.reshape(B, nkv, g, hd), kc[:B, :, :max_len],
                                               vc[:B, :, :max_len], attn_mask=mask)
            x = self._mlp_out(L, x, a.reshape(B, 1, -1))
        return self._logits(x[:, 0])

    def _decode_native(self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """:meth:`decode` with the norms and RoPE + KV write + attention as native calls. The loop runs 30+
        times per token, so it calls the C functions directly and reuses one norm and one attention buffer.

        The matmuls run on the batch rounded up to a multiple of DECODE_ROWS: oneDNN caches one primitive, with
        its generated kernels, per row count, and a decode batch takes every size from 1 to ``--max-running``
        (0.14 GiB of a SmolLM2-135M run's memory at 1-64 rows). The extra rows are token 0 with zero norm and
        attention outputs, so they stay finite and never reach a real row: each row of a matmul is reduced on
        its own (the real rows' logits are bitwise the same; tested), and a decode step reads the same weights."""
        c, K = self.cfg, self.native
        B, nh, nkv, hd, H = tokens.shape[0], c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
        norm, attn, nt, eps = K.raw_norm[self.dtype], K.raw_attn[self.dtype], torch.get_num_threads(), c.rms_eps
        pos = pos.contiguous()
        rows = -(-B // DECODE_ROWS) * DECODE_ROWS
        if rows != B:
            tokens = torch.cat([tokens, tokens.new_zeros(rows - B)])
        h = torch.zeros(rows, H, dtype=self.dtype)        # the norms write rows < B only
        a = torch.zeros(rows, nh * hd, dtype=self.dtype)  # so does the attention
        hp, ap, cosp, sinp, posp = h.data_ptr(), a.data_ptr(), self.cos.data_ptr(), self.sin_signed.data_ptr(), \
            pos.data_ptr()
        row, cap, scale = (nh + 2 * nkv) * hd, cache.capacity, hd ** -0.5
        x = F.embedding(tokens, self.embed)
        for L, kc, vc in zip(self.layers, cache.k, cache.v):
            norm(x.data_ptr(), L.in_norm.data_ptr(), hp, B, H, H, eps, nt)
            qkv = L.qkv(h)
            attn(qkv.data_ptr(), row, B, nh, nkv, hd, cosp, sinp, posp, kc.data_ptr(), vc.data_ptr(), cap, ap,
                 scale, nt)
            x = L.o.add(a, x)
            norm(x.data_ptr(), L.post_norm.data_ptr(), hp, B, H, H, eps, nt)
            x = L.mlp_out(h, x)
        return self._logits(x)[:B]


def safetensor_files(path: str | Path) -> list[Path]:
    """All ``*.safetensors`` files of a HF directory (sorted); error if none."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files found")
    return files


def iter_safetensors(files: list[Path]):
    """Yield ``(hf_name, tensor)`` from every file, in order."""
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for name in h.keys():
                yield name, h.get_tensor(name)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Resolve "auto" | "bf16" | "fp32" (also "bfloat16", "float32")."""
    d = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}
    if dtype in d:
        return d[dtype]
    if dtype != "auto":
        raise ValueError(f"dtype={dtype!r}: choose auto, bf16 or fp32")
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def cpu_has_fast_bf16() -> bool:
    """True if the CPU advertises AVX512-BF16 or AMX-BF16 (bf16 matmul much faster than fp32)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


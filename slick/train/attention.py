"""Attention over a packed row, one segment at a time: cost grows with the segments, not with the row squared.

A packed row (``slick.train.packing``) holds many sequences. Each *segment* is a run of query rows
``[s0, s1)`` that attends causally to itself and, when it is a response sharing a prompt, to the whole
prompt ``[p0, p0 + P)`` before it. A dense ``N x N`` mask over the row gives the same numbers, but its
attention costs ``N^2``: at 5,000 tokens of 80-token samples that is 60x the work of the segments, and
torch's CPU flash-attention backward over it was the largest single kernel of a training step.

:class:`Segments` cuts segments into query blocks where that saves work (:func:`_blocks`), gathers every
block's queries ``[S, Lq]`` and keys ``[S, Lk]`` (padded to the longest),
computes attention for all of them at once with a small ``[S, 1, Lq, Lk]`` mask (scores and softmax in fp32:
at these block sizes two batched matmuls beat torch's CPU flash kernel about 2x, forward + backward) and
scatters the rows back.
The trainer's models use it as the attention implementation ``"slick_segments"`` (:func:`use_segments`);
called without segments (a plain ``model(input_ids)``), that implementation is ordinary SDPA with SDPA's
masks. With segments, the model receives ``attention_mask=segments.mask`` (4-D, so transformers passes it
through untouched instead of building an ``N x N`` mask) and ``slick_segments=segments``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

NAME = "slick_segments"
MIN_BLOCK = 8      # query rows: smaller blocks make batched matmuls too small to pay
#: a segment of at least this many rows is attended alone by torch's causal flash kernel, its prompt rows computed
#: as queries too: memory grows with its length, not its square (an 8k-token response's scores: ~2.4 GB a layer)
LONG_ROWS = 1024


@dataclass
class Segments:
    """Index tensors for segment attention over a packed row of ``n`` tokens.

    ``spans``: ``(p0, P, s0, s1)`` per segment: query rows ``[s0, s1)`` attend to ``[p0, p0 + P)`` and
    causally to themselves (``P = 0``: no prompt prefix). Every row of ``[0, n)`` is in exactly one segment.
    The index tensors are per query *block* (:func:`_blocks`): a segment may be cut in several. Segments of
    ``long_rows`` rows or more (``long``) are not padded into that batch: each is attended alone, causally over
    its prompt's rows and its own (:meth:`long_rows`) by torch's flash kernel, which keeps no scores, so no tensor
    grows with a length squared; the prompt's rows are computed as queries too and their outputs dropped.
    """
    spans: list[tuple[int, int, int, int]]
    n: int
    q_index: torch.Tensor      # [S, Lq] long (S blocks): row of each query slot (padding slots: row 0)
    k_index: torch.Tensor      # [S, Lk] long: row of each key slot (padding slots: row 0)
    mask: torch.Tensor         # [S, 1, Lq, Lk] bool, True = attend; every query slot attends to >= 1 key
    out_index: torch.Tensor    # [n] long: each row's slot in the outputs: the short blocks' S * Lq, then each long
    #                            segment's rows in order
    long: tuple = ()           # (p0, P, s0, s1) of each long segment

    @classmethod
    def build(cls, spans: Sequence[tuple[int, int, int, int]], n: int, long_rows: int = LONG_ROWS) -> "Segments":
        spans = [tuple(int(x) for x in sp) for sp in spans if sp[3] > sp[2]]
        short = [sp for sp in spans if sp[3] - sp[2] < long_rows]
        long = tuple(sp for sp in spans if sp[3] - sp[2] >= long_rows)
        blocks = _blocks(short) if short else []
        S = len(blocks)
        Lq = max((b - a for *_, a, b in blocks), default=1)
        Lk = max((P + b for _, P, _, _, b in blocks), default=1)
        q_index = torch.zeros(S, Lq, dtype=torch.long)
        k_index = torch.zeros(S, Lk, dtype=torch.long)
        mask = torch.zeros(S, 1, Lq, Lk, dtype=torch.bool)
        out_index = torch.full((n,), -1, dtype=torch.long)
        for j, (p0, P, s0, a, b) in enumerate(blocks):
            L = b - a
            q_index[j, :L] = torch.arange(s0 + a, s0 + b)
            k_index[j, :P] = torch.arange(p0, p0 + P)
            k_index[j, P:P + b] = torch.arange(s0, s0 + b)
            mask[j, 0, :L, :P] = True
            mask[j, 0, :L, P:P + b] = torch.ones(L, b, dtype=torch.bool).tril(a)   # own rows up to itself
            mask[j, 0, L:, 0] = True          # padding queries look at one key; their outputs are dropped
            out_index[s0 + a:s0 + b] = torch.arange(j * Lq, j * Lq + L)
        slot = S * Lq
        for _, _, s0, s1 in long:
            out_index[s0:s1] = torch.arange(slot, slot + s1 - s0)
            slot += s1 - s0
        if bool((out_index < 0).any()):
            raise ValueError(f"segments leave rows {torch.nonzero(out_index < 0).flatten()[:5].tolist()} "
                             f"of a {n}-token row uncovered")
        return cls(spans, n, q_index, k_index, mask, out_index, long)

    def long_rows(self, j: int) -> torch.Tensor:
        """The rows long segment ``j`` is attended over, in order: its prompt's, then its own."""
        p0, P, s0, s1 = self.long[j]
        dev = self.q_index.device
        return torch.cat([torch.arange(p0, p0 + P, device=dev), torch.arange(s0, s1, device=dev)])

    @property
    def slots(self) -> int:
        """Query slots of the short blocks (padding included) and the long segments: the length of their outputs, concatenated."""
        return self.q_index.numel() + sum(s1 - s0 for *_, s0, s1 in self.long)

    @property
    def cost(self) -> int:
        """Query x key pairs computed (padding included; a long segment's: causal, its prompt's rows included)."""
        S, Lq = self.q_index.shape
        return S * Lq * self.k_index.shape[1] + sum((P + s1 - s0) * (P + s1 - s0 + 1) // 2
                                                    for _, P, s0, s1 in self.long)

    def worth_it(self) -> bool:
        """True when the segments compute fewer query x key pairs than half the dense row does, or hold a long
        segment (the dense row's ``N x N`` mask grows with its square)."""
        return bool(self.long) or 2 * self.cost < self.n * self.n

    def dense_mask(self) -> torch.Tensor:
        """The same attention pattern as one ``[1, 1, n, n]`` bool mask (the dense path's input)."""
        m = torch.zeros(self.n, self.n, dtype=torch.bool)
        for p0, P, s0, s1 in self.spans:
            m[s0:s1, p0:p0 + P] = True
            m[s0:s1, s0:s1] = torch.ones(s1 - s0, s1 - s0, dtype=torch.bool).tril()
        return m.view(1, 1, self.n, self.n)

    def to(self, device) -> "Segments":
        return Segments(self.spans, self.n, self.q_index.to(device), self.k_index.to(device),
                        self.mask.to(device), self.out_index.to(device), self.long)


def _split(spans: list, c: int) -> list:
    """Query blocks ``(p0, P, s0, a, b)`` of at most ``c`` rows: block ``[s0 + a, s0 + b)`` of a segment attends
    to its prompt ``[p0, p0 + P)`` and causally to the segment's rows ``[s0, s0 + b)``, which is the same
    attention those rows have in the whole segment."""
    return [(p0, P, s0, a, min(a + c, s1 - s0)) for p0, P, s0, s1 in spans for a in range(0, s1 - s0, c)]


def _cost(blocks: list) -> int:
    """Work of attending ``blocks`` padded to the longest: query x key pairs, plus gathering each block's keys
    and values (about one more query row per block: what keeps blocks from getting tiny)."""
    return len(blocks) * (max(b - a for *_, a, b in blocks) + 1) * max(P + b for _, P, _, _, b in blocks)


def _blocks(spans: list) -> list:
    """The query blocks attention is computed in. All blocks are padded to the longest, so one long segment
    among short ones (shared-prompt packing: a 45-token prompt among ~12-token responses; responses of 5 to 48
    tokens) makes every block pay for the longest one's query rows; cutting segments into blocks of the length
    that computes the fewest query x key pairs removes most of that padding. Whole segments unless cutting
    saves at least a quarter."""
    whole = _split(spans, max(s1 - s0 for *_, s0, s1 in spans))
    best, best_cost = whole, _cost(whole)
    for c in sorted({s1 - s0 for *_, s0, s1 in spans if s1 - s0 >= MIN_BLOCK})[:-1]:
        blocks = _split(spans, c)
        if _cost(blocks) < best_cost:
            best, best_cost = blocks, _cost(blocks)
    return best if best_cost < 0.75 * _cost(whole) else whole


def segment_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                      scaling: Optional[float] = None, slick_segments: Optional[Segments] = None, **kwargs):
    """HF attention-interface function: ``query [1,H,N,D]``, ``key``/``value [1,KVH,N,D]`` -> ``([1,N,H,D], None)``."""
    if slick_segments is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    seg = slick_segments
    if query.shape[0] != 1 or query.shape[2] != seg.n:
        raise ValueError(f"segment attention needs one packed row of {seg.n} tokens, got query {tuple(query.shape)}")
    H, D = query.shape[1], query.shape[3]
    scale = scaling if scaling is not None else D ** -0.5
    outs = []
    if seg.q_index.shape[0]:     # the short blocks: two batched matmuls and a softmax beat torch's CPU flash kernel
        S, Lq = seg.q_index.shape      # (~2x fwd+bwd at these sizes)
        Lk = seg.k_index.shape[1]
        q = query[0].index_select(1, seg.q_index.reshape(-1)).view(H, S, Lq, D).transpose(0, 1)
        k = _heads(key[0].index_select(1, seg.k_index.reshape(-1)), S, Lk, H)
        v = _heads(value[0].index_select(1, seg.k_index.reshape(-1)), S, Lk, H)
        if dropout:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=seg.mask, dropout_p=dropout, scale=scale)
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(scale).masked_fill_(~seg.mask, float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)
        outs.append(out.transpose(1, 2).reshape(S * Lq, H, D))
    for j, (_, P, s0, s1) in enumerate(seg.long):    # each long segment alone: torch's causal kernel keeps no scores
        rows = seg.long_rows(j)
        q = query[:, :, rows]
        k, v = _heads(key[0][:, rows], 1, P + s1 - s0, H), _heads(value[0][:, rows], 1, P + s1 - s0, H)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
        outs.append(out[0, :, P:].transpose(0, 1))
    out = (outs[0] if len(outs) == 1 else torch.cat(outs)).index_select(0, seg.out_index)
    return out.unsqueeze(0), None


def _heads(x: torch.Tensor, S: int, L: int, H: int) -> torch.Tensor:
    """Gathered ``[KVH, S * L, D]`` keys or values -> ``[S, H, L, D]``; grouped-query attention: kv head j serves
    query heads j*r .. j*r + r - 1 (HF's repeat_kv)."""
    KVH, D = x.shape[0], x.shape[2]
    x = x.view(KVH, S, L, D).transpose(0, 1)
    return x.repeat_interleave(H // KVH, dim=1) if KVH != H else x


def use_segments(model: torch.nn.Module) -> None:
    """Make ``model`` (a HF model) dispatch attention to :func:`segment_attention`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, segment_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)   # plain calls get SDPA's masks (padding, packing)
    model.config._attn_implementation = NAME

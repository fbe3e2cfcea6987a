"""Preallocated key/value cache: one slot per running sequence, grown by doubling (never per token).

Layout per layer: ``k[i]``/``v[i]`` of shape ``[slots, kv_heads, capacity, head_dim]``. The engine keeps
its running sequences in slots ``0..B-1`` so a decode step reads a plain view ``k[i][:B, :, :T]``;
when a sequence leaves, the last one is moved into its slot (:meth:`move`).
"""
from __future__ import annotations

import torch


class KVCache:
    """Per-layer K/V tensors with ``slots`` x ``capacity`` positions; grows on demand up to the limits."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 max_slots: int, max_len: int):
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.max_slots, self.max_len = max_slots, max_len
        self.slots = 0
        self.capacity = 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def ensure(self, slots: int, length: int) -> None:
        """Make room for ``slots`` sequences of ``length`` positions (rounded up to powers of two)."""
        if slots <= self.slots and length <= self.capacity:
            return
        if slots > self.max_slots or length > self.max_len:
            raise ValueError(f"KV cache request ({slots} slots x {length}) exceeds limits "
                             f"({self.max_slots} x {self.max_len})")
        new_s = min(self.max_slots, max(self.slots, _pow2(slots), 4))
        new_c = min(self.max_len, max(self.capacity, _pow2(length), 64))
        shape = (new_s, self.kv_heads, new_c, self.head_dim)
        nk, nv = [], []
        for i in range(self.num_layers):
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if self.slots and self.capacity:
                k[:self.slots, :, :self.capacity] = self.k[i]
                v[:self.slots, :, :self.capacity] = self.v[i]
            nk.append(k)
            nv.append(v)
            if self.k:  # free the old layer at once to keep the peak low
                self.k[i] = self.v[i] = None
        self.k, self.v = nk, nv
        self.slots, self.capacity = new_s, new_c

    def copy(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst`` (all layers)."""
        for k, v in zip(self.k, self.v):
            k[dst, :, :length] = k[src, :, :length]
            v[dst, :, :length] = v[src, :, :length]

    move = copy

    def broadcast(self, src: int, dsts: list[int], length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into every slot of ``dsts`` (all layers)."""
        if not dsts:
            return
        idx = torch.tensor(dsts, dtype=torch.long, device=self.device)
        for k, v in zip(self.k, self.v):
            k[idx, :, :length] = k[src, :, :length]
            v[idx, :, :length] = v[src, :, :length]

    def release(self) -> int:
        """Free every tensor (the cache grows again on demand, from empty); returns the bytes freed."""
        freed = self.nbytes()
        self.k, self.v, self.slots, self.capacity = [], [], 0, 0
        return freed

    def nbytes(self) -> int:
        """Bytes currently allocated."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())

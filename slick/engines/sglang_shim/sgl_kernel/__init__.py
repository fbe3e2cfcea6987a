"""The ``sgl_kernel`` CPU functions SGLang 0.5.23 imports at module level (slick/engines/sglang_shim).

The two a served request reaches are written here in torch: ``assign_req_to_token_pool_cpu`` (a request's KV slots
into its row of the request-to-token table) and ``copy_all_layer_kv_cache_cpu`` (KV rows moved in every layer's
buffer). The speculative-decoding ones (``SPECULATIVE``) exist so their modules import, and raise
NotImplementedError when called. Any other name is absent (ImportError), so SGLang's own fallbacks still apply.
"""
from __future__ import annotations

import ctypes

import torch

__version__ = "0.0.0+slick-cpu-shim"


def assign_req_to_token_pool_cpu(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                                 start_offset: torch.Tensor, end_offset: torch.Tensor,
                                 out_cache_loc: torch.Tensor, pool_len: int) -> None:
    """For request ``i``: ``req_to_token[req_pool_indices[i], start[i]:end[i]]`` = the next ``end[i] - start[i]``
    entries of ``out_cache_loc`` (request 0's first, then request 1's, ...). In place; ``pool_len`` is
    ``req_to_token``'s row length (the kernel's pointer arithmetic; checked here)."""
    if req_to_token.shape[1] != int(pool_len):
        raise ValueError(f"pool_len {pool_len} is not req_to_token's row length {req_to_token.shape[1]}")
    start, end = start_offset.long().cpu(), end_offset.long().cpu()
    lens = (end - start).clamp_min(0)
    total = int(lens.sum())
    if total == 0:
        return
    rows = torch.repeat_interleave(req_pool_indices.long().cpu(), lens)
    first = torch.repeat_interleave(torch.cumsum(lens, 0) - lens, lens)      # where each request's run begins
    cols = torch.repeat_interleave(start, lens) + torch.arange(total) - first
    req_to_token[rows, cols] = out_cache_loc[:total].to(req_to_token.dtype)


def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """For every buffer ``b`` (its address ``data_ptrs[b]``, ``strides[b]`` bytes a row): row ``tgt_loc[j]`` =
    row ``src_loc[j]``, all source rows read before any is written (safe when the two sets overlap)."""
    src, tgt = src_loc.long().cpu(), tgt_loc.long().cpu()
    if src.numel() != tgt.numel():
        raise ValueError(f"{src.numel()} source rows but {tgt.numel()} target rows")
    if src.numel() == 0:
        return
    rows = int(torch.maximum(src.max(), tgt.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * int(stride))).from_address(int(ptr))
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, int(stride))
        buf[tgt] = buf[src]          # advanced indexing copies the source rows first


def _unused(name: str):
    """A name SGLang imports at module level for speculative decoding on a CPU, which slick's servers do not run:
    calling it raises NotImplementedError naming it."""
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not in slick's CPU stand-in (slick/engines/sglang_shim): "
                                  "speculative decoding is not supported on these servers")
    refuse.__name__ = refuse.__qualname__ = name
    return refuse


SPECULATIVE = ("build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "assign_draft_cache_locs_contiguous_cpu",
               "assign_extend_cache_locs_cpu", "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu")
globals().update({name: _unused(name) for name in SPECULATIVE})

"""torch.distributed plumbing for trainer ranks: process group set-up, rank bookkeeping, work split, gathers.

The trainer ranks of one run form ONE default process group (gloo on CPU, NCCL on CUDA). Every collective
runs under the group's timeout; :func:`named_errors` turns a failure (a peer died, a collective never
completed) into a ``RankError`` that names the rank, the world size and the operation.
"""
from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
import sys
from typing import Iterator, Optional, Sequence

import torch
import torch.distributed as dist


class RankError(RuntimeError):
    """A collective failed or timed out on this trainer rank (a peer died, hung, or disagreed)."""


def resolve_backend(backend: str) -> str:
    """``"auto"`` -> nccl when CUDA is available, else gloo; ``"gloo"``/``"nccl"`` as given."""
    if backend in (None, "", "auto"):
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown torch.distributed backend '{backend}' (choose auto, gloo, nccl)")
    return backend


def init_process_group(backend: str, rank: int, world_size: int, master_addr: str, master_port: int,
                       timeout_s: float) -> None:
    """Join the trainer group as ``rank`` of ``world_size`` (TCP rendezvous at ``master_addr:master_port``).

    ``timeout_s`` bounds the rendezvous and every later collective: one that does not complete in time raises
    on the ranks that wait (wrapped into :class:`RankError` by :func:`named_errors`). With NCCL the rank uses
    ``LOCAL_RANK`` (or the current CUDA device, e.g. the one Ray assigned) as its GPU.
    """
    backend = resolve_backend(backend)
    if not 0 <= int(rank) < int(world_size):
        raise ValueError(f"rank {rank} is outside 0..{int(world_size) - 1} (world_size {world_size})")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive (got {timeout_s})")
    if dist.is_initialized():
        raise RuntimeError(f"rank {rank}: torch.distributed is already initialised "
                           f"(rank {dist.get_rank()} of {dist.get_world_size()}); call destroy() first")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError(f"rank {rank}: backend nccl needs a CUDA device and none is visible")
        local = os.environ.get("LOCAL_RANK")
        torch.cuda.set_device(int(local) if local is not None else torch.cuda.current_device())
    if backend == "gloo" and sys.platform == "linux" and is_loopback(master_addr):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # gloo's pair sockets on loopback too, not every interface
    timeout = datetime.timedelta(seconds=float(timeout_s))
    try:
        store = _rendezvous_store(master_addr, int(master_port), int(rank), int(world_size), timeout)
        dist.init_process_group(backend=backend, store=store, rank=int(rank), world_size=int(world_size),
                                timeout=timeout)
    except Exception as e:  # rendezvous timeout, port in use...
        raise RankError(f"trainer rank {rank} of {world_size}: could not join the process group at "
                        f"{master_addr}:{master_port} ({backend}) within {timeout_s:g}s: {e}") from e


def is_loopback(addr: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    try:
        return addr == "localhost" or ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _rendezvous_store(master_addr: str, port: int, rank: int, world_size: int, timeout) -> dist.TCPStore:
    """The group's TCPStore. Rank 0 binds its listening socket to ``master_addr`` itself and hands it over, so
    the store listens there only (torch's own bind takes every interface, whatever address it is given)."""
    if rank != 0:
        return dist.TCPStore(master_addr, port, world_size, False, timeout)
    host = "127.0.0.1" if master_addr == "localhost" else master_addr
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(max(128, world_size))
        store = dist.TCPStore(host, port, world_size, True, timeout, wait_for_workers=False,
                              master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()   # the store owns the listening socket now
    return store


def world() -> tuple[int, int]:
    """(rank, world_size) of this process; (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_distributed() -> bool:
    """True when this process is one of several trainer ranks."""
    return world()[1] > 1


def destroy() -> None:
    """Leave the process group (no-op when not initialised)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def comm_device() -> torch.device:
    """Where tensors must live for the group's collectives (the current GPU for NCCL, else CPU)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@contextlib.contextmanager
def named_errors(what: str) -> Iterator[None]:
    """Re-raise any failure inside as :class:`RankError` naming this rank and ``what`` was running."""
    try:
        yield
    except RankError:
        raise
    except Exception as e:
        rank, n = world()
        raise RankError(f"trainer rank {rank} of {n}: {what} failed (a peer rank died, hung past the "
                        f"process-group timeout, or called a different collective): {type(e).__name__}: {e}"
                        ) from e


def barrier(what: str) -> None:
    """A barrier (no-op in one process) whose failure names the rank."""
    if is_distributed():
        with named_errors(f"barrier ({what})"):
            # a CPU tensor all-reduce honours the group timeout on gloo (dist.barrier() may not)
            t = torch.zeros(1, device=comm_device())
            dist.all_reduce(t)


def split_for_ranks(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Split sample indices ``0..n-1`` into ``world_size`` contiguous, token-balanced runs.

    ``lengths[i]`` is the cost of sample ``i`` (its packed tokens). The runs keep the given order (samples
    of one prompt group stay together, so prompt sharing still works on each rank) and minimise the largest
    run's token sum. Deterministic: every rank computes the same split. When ``n >= world_size`` every rank
    gets at least one sample; with fewer samples than ranks, ranks ``n..world_size-1`` get an empty run
    (they still take part in every collective with a zero-contribution micro-batch).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1 (got {world_size})")
    costs = [max(0, int(x)) for x in lengths]
    n = len(costs)
    if world_size == 1:
        return [list(range(n))]
    if n <= world_size:
        return [[i] for i in range(n)] + [[] for _ in range(world_size - n)]

    def parts_needed(cap: int) -> int:
        parts, cur = 1, 0
        for c in costs:
            if cur + c > cap:
                parts, cur = parts + 1, c
            else:
                cur += c
        return parts

    lo, hi = max(costs), sum(costs)
    while lo < hi:  # smallest cap that fits in world_size runs
        mid = (lo + hi) // 2
        if parts_needed(mid) <= world_size:
            hi = mid
        else:
            lo = mid + 1
    out: list[list[int]] = [[]]
    cur = 0
    for i, c in enumerate(costs):
        left_items, left_parts = n - i, world_size - len(out)
        # close the current run when it would overflow, or when every remaining item must open a run
        if out[-1] and (cur + c > lo or left_items <= left_parts):
            out.append([])
            cur = 0
        out[-1].append(i)
        cur += c
    return out


def all_gather_flat(local: torch.Tensor, sizes: Sequence[int], what: str) -> list[torch.Tensor]:
    """All-gather a 1-D fp32 tensor whose length on rank r is ``sizes[r]`` (known to every rank)."""
    rank, n = world()
    if local.numel() != sizes[rank]:
        raise RankError(f"trainer rank {rank} of {n}: {what}: has {local.numel()} values, expected {sizes[rank]}")
    width = max(max(sizes), 1)
    dev = comm_device()
    buf = torch.zeros(width, dtype=local.dtype, device=dev)
    buf[: local.numel()] = local.to(dev)
    outs = [torch.empty_like(buf) for _ in range(n)]
    with named_errors(what):
        dist.all_gather(outs, buf)
    return [o[:s].cpu() for o, s in zip(outs, sizes)]


def all_reduce_values(values: Sequence[float], op: str, what: str) -> list[float]:
    """Sum (``op="sum"``) or max (``op="max"``) of a list of floats over the ranks (float64)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=comm_device())
    with named_errors(what):
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.cpu().tolist()


def all_gather_objects(obj, what: str) -> list:
    """``dist.all_gather_object`` with a rank-naming error."""
    out: list[Optional[object]] = [None] * world()[1]
    with named_errors(what):
        dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, what: str, src: int = 0):
    """Rank ``src``'s ``obj`` on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    with named_errors(what):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def step_metrics_over_ranks(sums: dict, totals: list, diff_max: float, elapsed: float) -> tuple:
    """A train step's metrics over every rank (collective): ``sums`` (by name) and ``totals`` summed, the largest
    logprob gap and the slowest rank's seconds. Returns (sums, totals, diff_max, elapsed)."""
    keys = sorted(set().union(*all_gather_objects(sorted(sums), "train_step metric names")))
    diff_max = all_reduce_values([diff_max], "max", "train_step logprob gap")[0]
    vals = all_reduce_values(totals + [sums.get(k, 0.0) for k in keys], "sum", "train_step metrics")
    elapsed = all_reduce_values([elapsed], "max", "train_step timing")[0]
    return dict(zip(keys, vals[len(totals):])), vals[:len(totals)], diff_max, elapsed

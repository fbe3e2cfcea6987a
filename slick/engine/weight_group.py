"""The engine (receiver) side of broadcast weight updates, with SGLang's API.

A trainer (rank 0) and k engines (ranks 1..k) form a **standalone** process group: its own ``TCPStore`` served
by the trainer at ``master_address:master_port`` and a ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU)
built on it directly, so no default ``torch.distributed`` group is needed or touched (a trainer's FSDP group
lives on beside it). The three calls, with SGLang's request fields:

* ``init_weights_update_group``: ``master_address``, ``master_port``, ``rank_offset`` (this engine's rank),
  ``world_size``, ``group_name`` (default "weight_update_group"), ``backend`` ("gloo" or "nccl"); slick adds
  ``timeout_s`` (default 600), the bound on joining and on every later broadcast of this group. It must be a
  finite number of seconds in (0, ``MAX_TIMEOUT_S``] (3600; ``WeightGroups(max_timeout_s=)``); anything else is
  refused (400 naming ``timeout_s``), so no caller makes the engine wait on it longer than that.
* ``update_weights_from_distributed``: ``names``, ``dtypes``, ``shapes`` (one broadcast from rank 0 per tensor,
  in that order), ``group_name``, ``flush_cache``, ``weight_version``; slick adds ``last_bucket`` (default
  true). A call with ``last_bucket: false`` only receives and keeps the tensors (staged, in the engine's
  memory); the call with ``last_bucket: true`` applies everything staged plus its own tensors in one
  all-or-nothing ``engine.update_weights(named_tensors=..., version=weight_version)``: the engine checks
  every name, shape and dtype first, then copies between two decode steps (pause -> load -> set version ->
  continue). Generation goes on while buckets arrive; only the final copy holds the step lock (and, in
  ``slick serve``, the server's weights lock: receiving holds neither, so a member whose sender never
  broadcasts delays no other update and fails by itself at its ``timeout_s``). Before any buffer is allocated
  every announced tensor is held to the engine's own model (``slick/engine/weight_staging.py``: a weight's name,
  its shape, float32/bfloat16/float16, each name once per update, all groups together within the model's size
  at float32); a bucket that fails these checks is refused without receiving anything and the group is dropped
  (its connections close, so the sender fails at once instead of blocking). An update that passes them but
  names too few weights is still refused as a whole by ``engine.update_weights``, after the receive.
  A failed receive (sender gone, timeout, a request that cannot be sized) drops the group and what was
  staged: the weights and version stay as they were, and the sender's next update forms a new group.
* ``destroy_weights_update_group``: ``group_name``; drops the group and anything staged for it.

:class:`WeightGroups` holds the groups of one engine; ``slick.serve.weight_group_routes`` serves it over
HTTP (``slick serve``) and ``slick.weights.transport.broadcast`` drives it directly for in-process engines
(the receiver then runs in a thread of the trainer's process).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import math
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from slick.engine.weight_staging import StagingBudget, StagingError, budget_bytes, check_announced, engine_shapes

DEFAULT_GROUP = "weight_update_group"
DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 3600.0       # the most seconds a caller may ask the engine to wait on a group (join, broadcast)
PATHS = ("/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group")
JOINED_KEY = "slick_joined/{rank}"       # set by every receiver before it builds the group (names the missing)


class WeightGroupError(ValueError):
    """A broadcast group call was refused or failed; the engine's weights and weight version are unchanged."""


# ----------------------------------------------------------------------------------- helpers (both sides)
def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's spelling of a dtype: ``torch.bfloat16`` -> "bfloat16"."""
    return str(dtype).replace("torch.", "")


def parse_dtype(name: Any) -> torch.dtype:
    """``"bfloat16"`` / ``"torch.float32"`` -> the torch dtype (floating point only)."""
    if not isinstance(name, str):
        raise WeightGroupError(f"dtype must be a string like 'bfloat16', got {name!r}")
    d = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(d, torch.dtype) or not d.is_floating_point:
        raise WeightGroupError(f"dtype {name!r} is not a floating point torch dtype")
    return d


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):
        return False


def local_address_towards(master_address: str) -> Optional[str]:
    """This host's address on the route to ``master_address`` (127.0.0.1 for a loopback master); None if unknown."""
    if is_loopback(master_address):
        return "127.0.0.1"
    try:
        fam = socket.AF_INET6 if ":" in master_address else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:   # no packet is sent: connect() only picks the route
            s.connect((master_address, 9))
            return s.getsockname()[0]
    except OSError:
        return None


def make_group(backend: str, store, rank: int, world_size: int, timeout_s: float, master_address: str):
    """A process group of ``world_size`` on ``store`` without any default group. Gloo binds each member to its
    own address on the route to the master (127.0.0.1 for a loopback master: one machine), not to whatever the
    host name resolves to."""
    timeout = datetime.timedelta(seconds=float(timeout_s))
    if backend == "gloo":
        from torch.distributed import ProcessGroupGloo

        opts = ProcessGroupGloo._Options()
        opts._timeout = timeout
        local = local_address_towards(master_address)
        opts._devices = [ProcessGroupGloo.create_device(hostname=local) if local
                         else ProcessGroupGloo.create_default_device()]
        return ProcessGroupGloo(store, rank, world_size, opts)
    if backend == "nccl":
        try:
            from torch.distributed import ProcessGroupNCCL
        except ImportError:
            raise WeightGroupError("backend 'nccl' needs a CUDA build of torch; use 'gloo'") from None
        opts = ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return ProcessGroupNCCL(store, rank, world_size, opts)
    raise WeightGroupError(f"backend {backend!r}: choose gloo or nccl")


def tensor_device(backend: str, engine_device: Optional[torch.device] = None) -> torch.device:
    """Where the broadcast buffers live: CPU for gloo, the CUDA device for NCCL."""
    if backend == "nccl":
        if engine_device is not None and engine_device.type == "cuda":
            return engine_device
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _field(body: dict, name: str, kind, default=Any):
    v = body.get(name, default)
    if v is Any:
        raise WeightGroupError(f"missing field {name!r}")
    if kind is int and isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        try:
            v = float(v)
        except OverflowError:
            raise WeightGroupError(f"field {name!r} is out of range, got {v}") from None
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise WeightGroupError(f"field {name!r} must be {kind.__name__}, got {v!r}")
    return v


# ----------------------------------------------------------------------------------- receiver
@dataclass
class _Group:
    name: str
    backend: str
    rank: int
    world_size: int
    timeout_s: float
    store: Any
    pg: Any
    staged: list = field(default_factory=list)       # (name, tensor) of buckets received, not applied yet
    lock: threading.Lock = field(default_factory=threading.Lock)


class WeightGroups:
    """The broadcast groups of one engine (``engine``: a LocalEngine or anything with ``update_weights`` and
    ``get_weight_version``). Blocking calls (``init``, ``receive``) run in a worker thread when called through
    the async methods, so an event loop serving the engine keeps answering meanwhile."""

    def __init__(self, engine, device: Optional[torch.device] = None, max_timeout_s: float = MAX_TIMEOUT_S):
        self.engine = engine
        self.device = device if device is not None else getattr(engine, "device", None)
        self.max_timeout_s = float(max_timeout_s)
        self.groups: dict[str, _Group] = {}
        self._lock = threading.Lock()
        self.shapes = engine_shapes(engine)     # the model's weights: what a bucket may announce
        self.budget = StagingBudget(budget_bytes(self.shapes) if self.shapes is not None else 0)

    # ---------------------------------------------------------------- init / destroy
    def init_sync(self, body: dict) -> str:
        """Join the group described by ``body`` (SGLang's init_weights_update_group fields); blocks until every
        member joined or ``timeout_s`` passed. Returns the group name."""
        from torch.distributed import PrefixStore, TCPStore

        if not isinstance(body, dict):
            raise WeightGroupError("init_weights_update_group body must be a JSON object")
        addr = _field(body, "master_address", str)
        port = _field(body, "master_port", int)
        rank = _field(body, "rank_offset", int)
        world = _field(body, "world_size", int)
        name = _field(body, "group_name", str, DEFAULT_GROUP) or DEFAULT_GROUP
        backend = _field(body, "backend", str, "gloo")
        timeout_s = _field(body, "timeout_s", float, min(DEFAULT_TIMEOUT_S, self.max_timeout_s))
        if not 0 < port < 65536:
            raise WeightGroupError(f"master_port {port} is not a TCP port")
        if world < 2 or not 1 <= rank < world:
            raise WeightGroupError(f"rank_offset {rank} must be in [1, world_size={world}) (rank 0 is the sender)")
        if not (math.isfinite(timeout_s) and 0 < timeout_s <= self.max_timeout_s):
            raise WeightGroupError(f"timeout_s must be a finite number of seconds in (0, {self.max_timeout_s:g}] "
                                   f"(this engine's maximum), got {timeout_s!r}")
        if backend not in ("gloo", "nccl"):
            raise WeightGroupError(f"backend {backend!r}: choose gloo or nccl")
        self.destroy(name)
        td = datetime.timedelta(seconds=timeout_s)
        try:
            store = TCPStore(addr, port, None, False, td)
            store.set(JOINED_KEY.format(rank=rank), "1")
            pg = make_group(backend, PrefixStore(name, store), rank, world, timeout_s, addr)
        except WeightGroupError:
            raise
        except Exception as e:  # noqa: BLE001 - DistStoreError, RuntimeError (gloo), ...
            raise WeightGroupError(f"could not join weight group {name!r} at {addr}:{port} as rank {rank} of "
                                   f"{world} within {timeout_s:g}s: {type(e).__name__}: {e}") from None
        with self._lock:
            self.groups[name] = _Group(name, backend, rank, world, timeout_s, store, pg)
        return name

    def destroy(self, name: str = DEFAULT_GROUP) -> bool:
        """Drop group ``name`` and what was staged for it; False when there was none."""
        with self._lock:
            g = self.groups.pop(name, None)
        if g is None:
            return False
        self.budget.release(name)
        g.staged.clear()
        g.pg = None          # the last reference: gloo closes its connections, peers blocked on it fail at once
        return True

    def _group(self, name: str) -> _Group:
        g = self.groups.get(name)
        if g is None:
            raise WeightGroupError(f"no weight update group named {name!r} on this engine "
                                   f"(call init_weights_update_group first; groups: {sorted(self.groups)})")
        return g

    # ---------------------------------------------------------------- receive
    def receive_sync(self, name: str, names: list, dtypes: list, shapes: list) -> list:
        """Receive one broadcast from rank 0 per announced tensor, in order; returns ``(name, tensor)``. The
        announcement is checked against the model and the staging budget before any buffer exists."""
        g = self._group(name)
        dev = tensor_device(g.backend, self.device)
        td = datetime.timedelta(seconds=g.timeout_s)
        out = []
        with g.lock:
            try:
                metas = _metas(names, dtypes, shapes)
                if self.shapes is None:
                    raise WeightGroupError(f"engine {type(self.engine).__name__} does not expose its weight "
                                           "shapes (weight_shapes()); broadcast updates are refused")
                nbytes = check_announced(self.shapes, metas, {n for n, _ in g.staged})
                self.budget.reserve(name, nbytes, self._idle_groups, self.destroy)
            except (WeightGroupError, StagingError) as e:
                self.destroy(name)  # the sender is broadcasting tensors we will not take: close, so it fails now
                raise WeightGroupError(f"weight group {name!r}: {e}") from None
            for n, dt, shape in metas:
                t = torch.empty(shape, dtype=dt, device=dev)
                try:
                    if g.pg is None:
                        raise RuntimeError("the group was destroyed")
                    g.pg.broadcast(t, 0, td).wait(td)
                except Exception as e:  # noqa: BLE001 - the sender died or timed out
                    self.destroy(name)     # the group is broken for good; the sender forms a new one
                    raise WeightGroupError(f"weight group {name!r}: receiving {n!r} from rank 0 failed: "
                                           f"{type(e).__name__}: {str(e)[:300]}") from None
                out.append((n, t))
        return out

    def _idle_groups(self) -> list[str]:
        """Groups holding staged buckets that are not receiving now (their sender left them): dropped first
        when another group needs the room."""
        with self._lock:
            return [n for n, g in self.groups.items() if g.staged and not g.lock.locked()]

    async def update_from_distributed(self, body: dict, apply_lock: Optional[asyncio.Lock] = None) -> dict:
        """SGLang's update_weights_from_distributed (see the module doc); returns the JSON answer. Any failure
        drops the group (the sender closes its side too and forms a new group for its next update).
        ``apply_lock`` (the server's weights lock) is held for the final copy only, never while receiving."""
        if not isinstance(body, dict):
            raise WeightGroupError("update_weights_from_distributed body must be a JSON object")
        name = _field(body, "group_name", str, DEFAULT_GROUP) or DEFAULT_GROUP
        g = self._group(name)
        try:
            names = _field(body, "names", list)
            dtypes = _field(body, "dtypes", list)
            shapes = _field(body, "shapes", list)
            last = _field(body, "last_bucket", bool, True)
            version = body.get("weight_version")
            if version is not None:
                try:
                    version = int(version)
                except (TypeError, ValueError):
                    raise WeightGroupError(f"weight_version must be an integer, got {version!r}") from None
            got = await in_daemon_thread(self.receive_sync, name, names, dtypes, shapes)
            if not last:
                g.staged.extend(got)
                return {"success": True, "message": f"received {len(got)} tensors (staged)",
                        "staged": len(g.staged)}
            pairs, g.staged = g.staged + got, []
            async with apply_lock if apply_lock is not None else contextlib.nullcontext():
                new = await self.engine.update_weights(named_tensors=pairs, version=version)
            self.budget.release(name)
        except BaseException:
            self.destroy(name)
            raise
        return {"success": True, "message": f"loaded {len(pairs)} tensors from group {name!r}",
                "weight_version": new}

    async def init(self, body: dict) -> str:
        return await in_daemon_thread(self.init_sync, body)

    def close(self) -> None:
        for name in list(self.groups):
            self.destroy(name)


def in_daemon_thread(fn, *args) -> asyncio.Future:
    """Run the blocking ``fn(*args)`` in a daemon thread; return an awaitable future of its result. Unlike
    ``asyncio.to_thread``, a call stuck in a collective (a peer that died) cannot hold up the exit of the event
    loop or of the interpreter (a SIGTERMed ``slick serve``); it ends by itself at the group's timeout."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def post(cb) -> None:
        try:
            loop.call_soon_threadsafe(cb)
        except RuntimeError:   # the loop closed while the thread ran: nobody is waiting any more
            pass

    def run() -> None:
        try:
            res = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            err = e
            post(lambda: fut.done() or fut.set_exception(err))
        else:
            post(lambda: fut.done() or fut.set_result(res))

    threading.Thread(target=run, name=f"slick-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return fut


def _metas(names, dtypes, shapes) -> list:
    if not (len(names) == len(dtypes) == len(shapes)):
        raise WeightGroupError(f"names, dtypes and shapes must have the same length "
                               f"({len(names)}, {len(dtypes)}, {len(shapes)})")
    out = []
    for n, d, s in zip(names, dtypes, shapes):
        if not isinstance(n, str) or not n:
            raise WeightGroupError(f"tensor name must be a non-empty string, got {n!r}")
        if not isinstance(s, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s):
            raise WeightGroupError(f"shape of {n!r} must be a list of non-negative integers, got {s!r}")
        out.append((n, parse_dtype(d), tuple(s)))
    return out


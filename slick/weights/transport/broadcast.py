"""The broadcast transport: a standalone gloo/NCCL group of the sender (rank 0) and every engine (ranks 1..k).

``connect(engines)``: the sender opens a ``TCPStore`` on a socket bound to ``master_addr`` (a free port) and
every engine joins a group named ``slick_weights_<id>``: each URL of an HTTP engine's ``control_urls`` (one
``slick serve`` or SGLang worker each) through ``/init_weights_update_group``, each in-process engine in a
thread of this process (:class:`slick.engine.weight_group.WeightGroups`). The sender builds its own member of
the group at the same time. The group is built on the store directly, never through the default
``torch.distributed`` group, so a trainer's FSDP group is left alone.

``send(version, named_tensors)``: buckets of at most ``bucket_bytes``; for each, every engine is told the names,
dtypes and shapes (``/update_weights_from_distributed``) while the sender broadcasts the tensors one by one.
Buckets but the last are staged by the engines; the last applies the whole version at once, all or nothing.

Failures: every step is bounded by ``timeout_s``. An engine that never joins, refuses, dies or stops answering
fails the call with a :class:`TransportError` naming it (its URL); the sender drops its member of the group at
once, which makes the other engines' pending receives fail too, so they drop what they staged and keep their
old weights and version. The next ``send`` connects again (and names the engine again if it is still gone).
"""
from __future__ import annotations

import asyncio
import datetime
import socket
import time
import uuid
from typing import Optional, Sequence

import torch

from slick.engine.weight_group import JOINED_KEY, MAX_TIMEOUT_S, WeightGroups, dtype_name, in_daemon_thread, make_group
from slick.weights.transport.buckets import iter_buckets, tensor_bytes, with_last
from slick.weights.transport.common import TransportError, bounded, engine_name, is_http

GRACE_S = 5.0        # after the first failure, how long the other members get to report theirs


class _HttpMember:
    def __init__(self, engine, url: str):
        self.engine, self.url, self.label = engine, url, url

    async def join(self, body: dict, timeout_s: float) -> None:
        # an engine waits on a group at most MAX_TIMEOUT_S (it refuses more); the sender keeps its own bound
        await self.engine.init_weights_update_group(self.url, timeout_s=min(timeout_s, MAX_TIMEOUT_S), **body)

    async def receive(self, body: dict, timeout_s: float) -> dict:
        return await self.engine.control(self.url, "/update_weights_from_distributed", body, timeout=timeout_s)

    async def leave(self, group: str) -> None:
        await self.engine.destroy_weights_update_group(self.url, group)


class _LocalMember:
    def __init__(self, engine):
        self.engine, self.label = engine, engine_name(engine)
        self.groups = WeightGroups(engine)

    async def join(self, body: dict, timeout_s: float) -> None:
        await in_daemon_thread(self.groups.init_sync, {**body, "timeout_s": min(timeout_s, MAX_TIMEOUT_S)})

    async def receive(self, body: dict, timeout_s: float) -> dict:
        return await self.groups.update_from_distributed(body)

    async def leave(self, group: str) -> None:
        self.groups.destroy(group)


class BroadcastTransport:
    name = "broadcast"

    def __init__(self, *, bucket_bytes: int, timeout_s: float, master_addr: str = "127.0.0.1",
                 backend: Optional[str] = None):
        self.bucket_bytes = int(bucket_bytes)
        self.timeout_s = float(timeout_s)
        self.master_addr = master_addr
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"broadcast backend {self.backend!r}: choose gloo or nccl")
        self.engines: list = []
        self.members: list = []
        self.group: Optional[str] = None
        self._box: list = [None]       # [the sender's process group]; emptied to close it
        self._store = None
        self.buckets_sent = 0          # buckets fully delivered, over the transport's life
        self.bytes_sent = 0

    @property
    def connected(self) -> bool:
        return self._box[0] is not None

    # ------------------------------------------------------------------ connect
    async def connect(self, engines: Sequence) -> None:
        """Form the group (module doc); raises TransportError naming every engine that did not join."""
        from torch.distributed import PrefixStore, TCPStore

        await self._drop()
        self.engines = list(engines)
        members: list = []
        for e in self.engines:
            if is_http(e):
                members += [_HttpMember(e, u) for u in e.control_urls]
            else:
                members.append(_LocalMember(e))
        if not members:
            raise TransportError("broadcast transport: no engines to connect to")
        world = len(members) + 1
        group = f"slick_weights_{uuid.uuid4().hex[:12]}"
        sock = socket.socket(socket.AF_INET6 if ":" in self.master_addr else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.master_addr, 0))
        sock.listen(max(128, world))
        port = sock.getsockname()[1]
        store = TCPStore(self.master_addr, port, None, True, datetime.timedelta(seconds=self.timeout_s),
                         wait_for_workers=False, master_listen_fd=sock.fileno())
        sock.detach()              # the store owns the listening socket now (and closes it when dropped)
        body = {"master_address": self.master_addr, "master_port": port, "world_size": world,
                "group_name": group, "backend": self.backend}
        joins = [asyncio.ensure_future(bounded(m.join({**body, "rank_offset": r}, self.timeout_s), self.timeout_s,
                                              f"engine {m.label} joining the weight group"))
                 for r, m in enumerate(members, start=1)]
        mine = asyncio.ensure_future(bounded(
            in_daemon_thread(make_group, self.backend, PrefixStore(group, store), 0, world, self.timeout_s,
                             self.master_addr), self.timeout_s + 1, "the sender (rank 0) forming the weight group"))
        errors = await _wait_all(joins + [mine], [f"engine {m.label} joining" for m in members]
                                 + ["the sender (rank 0) forming the group"], self.timeout_s + 2,
                                 grace_s=0.5)      # the others cannot form the group without the one that failed
        if errors:
            missing = [m.label for r, m in enumerate(members, start=1)
                       if not store.check([JOINED_KEY.format(rank=r)])]
            why = "; ".join(errors)
            if missing:
                why = f"never joined: {', '.join(missing)}; {why}"
            for t in joins + [mine]:
                t.cancel()
            raise TransportError(f"broadcast weight group ({world - 1} engines, {self.backend}, "
                                 f"{self.master_addr}:{port}) failed within {self.timeout_s:g}s: {why}")
        self._box, self._store = [mine.result()], store
        self.members, self.group = members, group

    # ------------------------------------------------------------------ send
    async def send(self, version: int, named_tensors) -> None:
        """Broadcast ``named_tensors`` as weight version ``version`` (module doc)."""
        if not self.connected:
            if not self.engines:
                raise TransportError("broadcast transport: send() before connect(engines)")
            await self.connect(self.engines)
        dev = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        td = datetime.timedelta(seconds=self.timeout_s)
        for i, (bucket, last) in enumerate(with_last(iter_buckets(named_tensors, self.bucket_bytes))):
            tensors = [t.detach().to(dev).contiguous() for _, t in bucket]
            body = {"names": [n for n, _ in bucket], "dtypes": [dtype_name(t.dtype) for t in tensors],
                    "shapes": [list(t.shape) for t in tensors], "group_name": self.group, "flush_cache": True,
                    "weight_version": str(int(version)), "last_bucket": last}
            recvs = [asyncio.ensure_future(bounded(m.receive(body, self.timeout_s), self.timeout_s,
                                                   f"engine {m.label} receiving bucket {i} of version {version}"))
                     for m in self.members]
            mine = asyncio.ensure_future(bounded(in_daemon_thread(_broadcast, self._box, tensors, td), self.timeout_s,
                                                 f"the sender broadcasting bucket {i} of version {version}"))
            errors = await _wait_all(recvs + [mine], [f"engine {m.label}" for m in self.members] + ["the sender"],
                                     self.timeout_s + 2, on_error=self._close_group)
            if errors:
                self._close_group()
                for t in recvs + [mine]:
                    t.cancel()
                raise TransportError(f"broadcast of weight version {version} failed at bucket {i}: "
                                     + "; ".join(errors))
            self.buckets_sent += 1
            self.bytes_sent += sum(tensor_bytes(t) for t in tensors)

    def _close_group(self) -> None:
        """Drop the sender's member (the last reference closes its connections): the other engines' pending
        receives fail at once and they drop what they staged."""
        self._box[0] = None

    # ------------------------------------------------------------------ disconnect
    async def disconnect(self) -> None:
        """Tell every engine to drop the group (bounded; engines that are gone are skipped), then drop ours."""
        if self.members and self.group:
            await asyncio.gather(*(bounded(m.leave(self.group), min(self.timeout_s, 30.0), f"engine {m.label}")
                                   for m in self.members), return_exceptions=True)
        await self._drop()
        self.engines = []

    async def _drop(self) -> None:
        self._close_group()
        self._store = None
        self.members, self.group = [], None


def _broadcast(box: list, tensors: list, td: datetime.timedelta) -> None:
    """Broadcast from rank 0. The group is read from ``box`` at each tensor and never kept in a local: an
    exception's traceback must not keep the group alive after ``_close_group`` emptied the box."""
    for t in tensors:
        if box[0] is None:
            raise RuntimeError("the weight group was closed")
        box[0].broadcast(t, 0, td).wait(td)
    if tensors and tensors[0].is_cuda:
        torch.cuda.synchronize(tensors[0].device)


async def _wait_all(tasks: list, labels: list, timeout_s: float, grace_s: float = GRACE_S,
                    on_error=None) -> list[str]:
    """Wait for every task; at the first failure give the others ``grace_s`` to report theirs. Returns the error
    messages (failed tasks, then tasks that had not finished)."""
    deadline = time.monotonic() + timeout_s
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                                           return_when=asyncio.FIRST_EXCEPTION)
        if not done:
            break
        if any(t.exception() is not None for t in done if not t.cancelled()):
            if on_error is not None:
                on_error()
            if pending and grace_s > 0:
                _, pending = await asyncio.wait(pending, timeout=grace_s)
            break
    errors = [str(t.exception()) for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    errors += [f"{labels[i]}: no answer yet" for i, t in enumerate(tasks) if not t.done()]
    return errors

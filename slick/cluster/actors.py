"""What every Ray actor slick starts shares, trainer ranks (slick.cluster.trainer_group) and engine actors
(slick.cluster.engine_actor) alike: waiting on their answers with a deadline, and their thread count."""
from __future__ import annotations

import os
import time
from typing import Sequence

from slick.cluster.layout import ClusterFailure, threads_per_actor


class RankError(ClusterFailure):
    """A trainer rank (or engine actor) died, failed, or did not answer in time; the message names it."""


def wait_all(refs: list, names: Sequence[str], timeout_s: float, what: str) -> list:
    """Results of ``refs`` in order. Raises :class:`RankError` naming the first actor that failed or died
    (as soon as it does, without waiting for the others) or every actor still silent after ``timeout_s``."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    index = {r: i for i, r in enumerate(refs)}
    out: list = [None] * len(refs)
    pending, deadline = list(refs), time.monotonic() + timeout_s
    while pending:
        left = deadline - time.monotonic()
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0.0))
        if not ready:
            silent = ", ".join(names[index[r]] for r in pending)
            raise RankError(f"{silent}: did not {what} within {timeout_s:g}s (timeout; a peer may have died)")
        for r in ready:
            i = index[r]
            try:
                out[i] = ray.get(r, timeout=max(deadline - time.monotonic(), 1.0))
            except RayActorError as e:
                raise RankError(f"{names[i]} died while asked to {what}: {_short(e)}") from e
            except RayTaskError as e:
                raise RankError(f"{names[i]} failed to {what}: {_short(e)}") from e
            except GetTimeoutError as e:
                raise RankError(f"{names[i]}: did not {what} within {timeout_s:g}s") from e
    return out


def _short(e: BaseException, n: int = 1500) -> str:
    text = str(e).strip()
    return text if len(text) <= n else "..." + text[-n:]


def set_actor_threads(slots_on_node: int) -> int:
    """torch/OpenMP threads of this actor: ``threads_per_actor(cores of this node, slots_on_node)``."""
    import torch   # in the actor's process only

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    threads = threads_per_actor(cores, slots_on_node)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads

"""Helpers shared by the transports: bounded engine calls that name the engine."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

from slick.train.transport import TransportError, engine_name


async def bounded(aw: Awaitable, timeout_s: float, what: str):
    """Await ``aw`` for at most ``timeout_s``; a timeout or an error becomes TransportError naming ``what``."""
    try:
        return await asyncio.wait_for(aw, timeout_s)
    except asyncio.TimeoutError:
        raise TransportError(f"{what}: no answer within {timeout_s:g}s (timeout)") from None
    except TransportError:
        raise
    except Exception as e:  # noqa: BLE001 - EngineError, WeightUpdateError, OSError, ...
        raise TransportError(f"{what}: {type(e).__name__}: {e}") from e


async def on_every_engine(engines: Sequence, fn: Callable[[object], Awaitable], timeout_s: float, what: str):
    """Run ``fn(engine)`` on every engine concurrently, each bounded; raise one TransportError naming every
    engine that failed (after all of them finished)."""
    results = await asyncio.gather(*(bounded(fn(e), timeout_s, f"{what} on engine {engine_name(e)}")
                                     for e in engines), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise TransportError("; ".join(str(e) for e in errors)) from errors[0]
    return results

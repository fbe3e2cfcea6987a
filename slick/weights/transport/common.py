"""Helpers shared by the transports: their error, how errors name an engine, bounded engine calls."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence


class TransportError(RuntimeError):
    """A weight transfer failed; the message names the engine (URL) that failed or did not answer."""


def engine_name(engine) -> str:
    """How errors name an engine: its URLs for HTTP engines, else its class and model path."""
    urls = getattr(engine, "control_urls", None)
    if urls:
        return ", ".join(urls)
    return f"{type(engine).__name__}({getattr(engine, 'model_path', '?')})"


def is_http(engine) -> bool:
    return bool(getattr(engine, "control_urls", None))


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

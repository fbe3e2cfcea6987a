"""slime's ``run(coro)``: run a coroutine from synchronous code and return its result.

The coroutines run on one event loop kept on a daemon thread for the life of the process (as slime does), so
what they create (an HTTP session, a task) stays usable by the next call. Called from inside that loop it would
wait on itself: that raises ``RuntimeError`` instead.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Optional

_loop: Optional[asyncio.AbstractEventLoop] = None
_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="slime-async-utils", daemon=True).start()
        return _loop


def run(coro: Awaitable[Any]) -> Any:
    loop = _background_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        raise RuntimeError("slime.utils.async_utils.run called from its own event loop: await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()

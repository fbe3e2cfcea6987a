"""A real reward server for benchmarks: aiohttp on 127.0.0.1, scores with the gsm8k rule after ``delay`` seconds
(a verifier, sandbox or LLM judge stand-in for --rm-type remote_rm). Runs on its own thread and event loop."""
from __future__ import annotations

import asyncio
import socket
import threading


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlowRewardServer:
    """``with SlowRewardServer(0.5) as s: ... s.url ...``"""

    def __init__(self, delay: float):
        self.delay, self.port = delay, free_port()
        self.url = f"http://127.0.0.1:{self.port}/score"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _start(self):
        from aiohttp import web

        from slick.reward.registry import builtin_score

        async def score(request):
            body = await request.json()
            await asyncio.sleep(self.delay)
            return web.json_response({"reward": builtin_score("gsm8k", body["response"], body["label"])})

        app = web.Application()
        app.router.add_post("/score", score)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self):
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

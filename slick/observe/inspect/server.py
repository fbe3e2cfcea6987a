"""`slick inspect RUN_DIR [--port P]`: a local web page (127.0.0.1 only) to look inside a run.

One static page (static/index.html + app.js, no network fetches) and a JSON API it polls; every request reads
the run directory's files again, so a run still training shows its new steps:

- ``GET /api/run``: name, verifier, stored steps, last update time
- ``GET /api/metrics``: metrics.jsonl rows and their keys
- ``GET /api/steps``: per stored step, reward / length distributions and staleness
- ``GET /api/samples?step=N&order=best|worst&limit=K``: a step's best or worst samples with their evidence
- ``GET /api/sample?step=N&index=I``: one sample with its tokens (text, loss mask, logprob, weight version)
- ``GET /trace.json``: the run's ``--trace-file`` (Chrome / Perfetto trace events), linked from the page

Every request passes the Host and Origin checks of ``slick/serve/http_guard.py`` (as ``slick serve``): a
``Host`` other than localhost, a loopback address or one of ``--allowed-hosts`` gets 403 (no DNS-rebinding page
can read the run's prompts and answers), and so does a request from a foreign ``Origin``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from aiohttp import web

from slick.serve.http_guard import HostPolicy, guard_middleware, parse_allowed_hosts
from slick.observe.inspect import data

STATIC = Path(__file__).parent / "static"
HOST = "127.0.0.1"


def _json(obj, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(obj, allow_nan=False, default=str), status=status,
                        content_type="application/json", headers={"Cache-Control": "no-store"})


def _int(request, name: str, default=None):
    raw = request.query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise web.HTTPBadRequest(text=json.dumps({"error": f"query parameter '{name}' is required"}),
                                     content_type="application/json")
        return default
    try:
        return int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"query parameter '{name}' must be an integer, got "
                                                           f"{raw!r}"}), content_type="application/json") from None


def make_app(run_dir, allowed_hosts=()) -> web.Application:
    """The page and its API for ``run_dir``; ``allowed_hosts``: extra names for the Host/Origin check."""
    run_dir = Path(run_dir)

    async def call(fn, *args):
        try:
            return _json(await asyncio.to_thread(fn, run_dir, *args))
        except KeyError as e:
            return _json({"error": e.args[0]}, 404)
        except ValueError as e:
            return _json({"error": str(e)}, 400)

    async def page(request):
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def script(request):
        return web.FileResponse(STATIC / "app.js", headers={"Cache-Control": "no-store",
                                                            "Content-Type": "text/javascript"})

    async def run(request):
        return await call(data.run_info)

    async def metrics(request):
        return await call(data.metrics)

    async def steps(request):
        return await call(data.steps_summary)

    async def samples(request):
        step = request.query.get("step")
        return await call(data.samples, _int(request, "step") if step else None,
                          request.query.get("order", "best"), _int(request, "limit", 5))

    async def sample(request):
        return await call(data.sample, _int(request, "step"), _int(request, "index"))

    async def trace(request):   # --trace-file, as written by the run
        path = await asyncio.to_thread(data.trace_file, run_dir)
        if path is None:
            return _json({"error": "this run has no --trace-file"}, 404)
        return web.FileResponse(path, headers={"Cache-Control": "no-store", "Content-Type": "application/json"})

    app = web.Application(middlewares=[guard_middleware(HostPolicy(HOST, allowed_hosts), max_body_bytes=1 << 16)])
    app.router.add_get("/", page)
    app.router.add_get("/app.js", script)
    app.router.add_get("/api/run", run)
    app.router.add_get("/api/metrics", metrics)
    app.router.add_get("/api/steps", steps)
    app.router.add_get("/api/samples", samples)
    app.router.add_get("/api/sample", sample)
    app.router.add_get("/trace.json", trace)
    return app


async def serve(run_dir, port: int, ready=print, allowed_hosts=()) -> None:
    """Serve until SIGINT/SIGTERM; ``ready(line)`` gets the URL once the socket listens."""
    runner = web.AppRunner(make_app(run_dir, allowed_hosts), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, port)
    try:
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]
        ready(f"slick inspect: serving {run_dir} at http://{HOST}:{bound}/ (Ctrl-C stops)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="slick inspect", description="Serve a local page (127.0.0.1) showing a run: "
                                "curves, reward and length distributions, best and worst samples with evidence, "
                                "tokens by loss mask and logprob, staleness. Works while the run is still going.")
    p.add_argument("run_dir", help="Run directory (metrics.jsonl, rollouts/).")
    p.add_argument("--port", type=int, default=8265, help="Port on 127.0.0.1 (0 = any free port).")
    p.add_argument("--allowed-hosts", default="",
                   help="Comma-separated host names the page also answers to besides localhost and loopback "
                        "addresses (e.g. the name an SSH tunnel or proxy uses); any other Host gets 403.")
    args = p.parse_args(argv)
    try:
        hosts = parse_allowed_hosts(args.allowed_hosts)
    except ValueError as e:
        p.error(str(e))
    if not Path(args.run_dir).is_dir():
        print(f"slick inspect: {args.run_dir}: no such run directory", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(args.run_dir, args.port, ready=lambda line: print(line, flush=True), allowed_hosts=hosts))
    except OSError as e:
        print(f"slick inspect: cannot listen on {HOST}:{args.port}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``slick serve`` command line: flags, start-up and shutdown of a :class:`SlickServer` (see
``slick/serve/server.py`` for the endpoints and docs/serving.md for the flags)."""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Optional

from aiohttp import web

from slick.serve import server as _server
from slick.serve.http_guard import parse_allowed_hosts
from slick.serve.openai_protocol import MAX_N
from slick.engine.local import LocalEngine
from slick.engine.limits import DEFAULTS as LIMIT_DEFAULTS, RequestLimits
from slick.serve.server import SlickServer
from slick.serve.sglang_args import KNOWN, engine_options, flag, split_sglang_args, unknown_warning
from slick.serve.weight_dirs import parse_dirs
from slick.models.check import model_dir_problems
from slick.proc.children import watch_parent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="slick serve", description=_server.__doc__.split("\n\n")[0],
        epilog="--sglang-KEY VALUE: SGLang server options. " + ", ".join(
            f"{flag(k)} sets --{name.replace('_', '-')}" for k, (name, _) in KNOWN.items())
        + " (and wins over it); any other --sglang-* option is ignored with a warning.")
    p.add_argument("--hf-checkpoint", "--model-path", dest="hf_checkpoint", required=True,
                   help="Hugging Face model directory to serve.")
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1, loopback only).")
    p.add_argument("--port", type=int, default=30000, help="TCP port (0 picks a free one).")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="Weight/compute dtype.")
    p.add_argument("--device", default="auto", help="torch device (auto: cuda if available, else cpu).")
    p.add_argument("--api-key", default=None,
                   help="Require 'Authorization: Bearer KEY' on every endpoint but /health, /health_generate and "
                        "/metrics (as SGLang), /v1/* included.")
    p.add_argument("--allowed-hosts", default="",
                   help="Comma-separated host names (or IPs) the server also answers to besides localhost, "
                        "loopback addresses and --host: the Host check against DNS rebinding, and Origins allowed "
                        "to call it from a browser ('*': any).")
    p.add_argument("--max-request-bytes", type=int, default=None,
                   help="Largest request body accepted, in bytes (413 above it, refused before reading; default "
                        "max(4 MiB, 256 x context length)).")
    p.add_argument("--allowed-weight-dirs", default="",
                   help="Comma-separated directories /update_weights_from_disk may load from (and anything below "
                        "them), besides --hf-checkpoint and the directories slick's disk weight sync writes.")
    p.add_argument("--max-running", type=int, default=64, help="Requests decoded together at most.")
    p.add_argument("--max-seq-len", type=int, default=None, help="Cap on prompt + response tokens.")
    p.add_argument("--seed", type=int, default=0, help="Engine sampling seed.")
    p.add_argument("--max-batch", type=int, default=4096, help="Most prompts accepted in one /generate.")
    d = LIMIT_DEFAULTS     # what one request may ask (slick/engine/limits.py); over a limit: 400 naming the flag
    p.add_argument("--max-stop-strings", dest="max_stop", type=int, default=d["max_stop"],
                   help=f"Most stop strings in one request (default {d['max_stop']}).")
    p.add_argument("--max-stop-chars", dest="max_stop_chars", type=int, default=d["max_stop_chars"],
                   help=f"Longest stop string, in characters (default {d['max_stop_chars']}).")
    p.add_argument("--max-n", dest="max_n", type=int, default=d["max_n"],
                   help=f"Most choices (n) of one OpenAI request (at most and by default {d['max_n']}).")
    p.add_argument("--max-grammar-bytes", dest="max_grammar_bytes", type=int, default=d["max_grammar_bytes"],
                   help="Largest json_schema / regex / ebnf constraint (response_format, tool_choice, sampling "
                        f"params), in UTF-8 bytes (default {d['max_grammar_bytes']}).")
    p.add_argument("--max-grammar-depth", dest="max_grammar_depth", type=int, default=d["max_grammar_depth"],
                   help=f"Deepest nesting of objects and arrays in a JSON schema (default {d['max_grammar_depth']}).")
    p.add_argument("--grammar-timeout-s", dest="grammar_timeout_s", type=float, default=d["grammar_timeout_s"],
                   help="Seconds a new grammar may take to compile (in a helper process first, so a grammar "
                        f"that crashes the compiler is refused; default {d['grammar_timeout_s']:g}).")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="Shut down (as on SIGTERM) when this process is no longer the parent, e.g. a driver "
                        "killed with SIGKILL; slick sets it for the workers it launches.")
    return p


async def serve(args: argparse.Namespace) -> int:
    """Load the engine, listen, and run until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if args.parent_pid:   # from the start: a driver that dies while this worker loads leaves no orphan
        watch_parent(args.parent_pid, lambda: loop.call_soon_threadsafe(stop.set), grace_s=20.0, what="slick serve")
    engine = LocalEngine(args.hf_checkpoint, dtype=args.dtype, device=args.device,
                         max_running=args.max_running, max_seq_len=args.max_seq_len, seed=args.seed,
                         limits=args.limits)
    server = SlickServer(engine, model_path=args.hf_checkpoint, api_key=args.api_key, max_batch=args.max_batch,
                         host=args.host, allowed_hosts=args.allowed_hosts, max_request_bytes=args.max_request_bytes,
                         allowed_weight_dirs=args.allowed_weight_dirs,
                         server_args={"host": args.host, "port": args.port, "dtype": args.dtype,
                                      "device": args.device, "max_running_requests": args.max_running,
                                      "max_seq_len": args.max_seq_len, "random_seed": args.seed,
                                      "api_key_set": bool(args.api_key),
                                      **{k: getattr(args, k) for k in LIMIT_DEFAULTS}})
    # handler_cancellation: a client that disconnects cancels its handler, which aborts its generation
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1] if runner.addresses else args.port
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"slick serve ready on http://{args.host}:{port}", flush=True)
    await stop.wait()
    print("slick serve: shutting down (aborting in-flight requests)", flush=True)
    await server.shutdown()
    await runner.cleanup()
    await engine.close()
    return 0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """Parse ``slick serve`` flags; ``--sglang-KEY VALUE`` options set the matching flag or get a warning."""
    parser = build_parser()
    rest, sglang = split_sglang_args(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    problems = model_dir_problems(args.hf_checkpoint, "--hf-checkpoint")
    if problems:  # before any import of transformers, which would try the Hub for a name like org/model
        parser.error("; ".join(problems))
    try:
        options, unknown = engine_options(sglang)
    except ValueError as e:
        parser.error(str(e))
    for name, value in options.items():
        setattr(args, name, value)
    try:
        args.allowed_hosts = parse_allowed_hosts(args.allowed_hosts)
    except ValueError as e:
        parser.error(str(e))
    args.allowed_weight_dirs = parse_dirs(args.allowed_weight_dirs)
    try:
        args.limits = RequestLimits(**{k: getattr(args, k) for k in LIMIT_DEFAULTS})
    except ValueError as e:
        parser.error(str(e))
    if args.max_n > MAX_N:
        parser.error(f"--max-n {args.max_n}: at most {MAX_N} (OpenAI's limit on n)")
    if args.max_request_bytes is not None and args.max_request_bytes < 1024:
        parser.error(f"--max-request-bytes {args.max_request_bytes}: must be at least 1024")
    if unknown:
        print(f"warning: {unknown_warning(unknown, 'slick serve')}", file=sys.stderr, flush=True)
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``slick serve``."""
    args = parse_args(argv)
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

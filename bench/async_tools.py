"""The multi-turn case of bench/async.py: a tool that answers after ``SLICK_BENCH_TOOL_DELAY`` seconds (default 1),
and a tool-call parser that calls it after every policy turn (random and small models rarely write tool calls)."""
import asyncio
import os


async def lookup(n: int) -> str:
    """Look something up (a slow remote tool: waits, then answers)."""
    await asyncio.sleep(float(os.environ.get("SLICK_BENCH_TOOL_DELAY", "1.0")))
    return f"result {n}"


def every_turn(text):
    """A --tool-parser: one lookup call after every turn."""
    return [{"name": "lookup", "arguments": {"n": len(text)}}]


TOOLS = [lookup]

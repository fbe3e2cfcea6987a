"""Tools for the multi-turn tests: well-behaved ones and every kind of failure (importable by module path,
as unsafe tools must be)."""
import asyncio
import os
import time

from slick.rollout.tools import tool

MB = 1 << 20


def add(a: int, b: int) -> int:
    """Add two integers.

    The second paragraph is not part of the description."""
    return a + b


async def echo(text: str = "") -> str:
    """Echo the text back."""
    await asyncio.sleep(0)
    return text


def boom(x: int = 0):
    """Raise."""
    raise RuntimeError(f"tool exploded on {x}")


@tool(timeout=0.3)
def hang_sync() -> str:
    """Sleep past the timeout (a daemon thread is abandoned)."""
    time.sleep(3)
    return "too late"


@tool(timeout=0.3)
async def hang_async() -> str:
    """Sleep past the timeout (cancelled)."""
    await asyncio.sleep(30)
    return "too late"


def big() -> str:
    """Return 1 MB of text."""
    return "x" * MB


@tool(unsafe=True)
def print_big() -> str:
    """Print 1 MB in a subprocess, then return a short result."""
    print("y" * MB)
    return "done"


@tool(unsafe=True)
def crash() -> str:
    """Kill its own process."""
    os._exit(3)


@tool(unsafe=True, timeout=0.5)
def hang_unsafe() -> str:
    """Hang in a subprocess (killed at the timeout)."""
    time.sleep(60)
    return "too late"


@tool(unsafe=True)
def pid() -> int:
    """The process id the tool ran in."""
    return os.getpid()


@tool(unsafe=True, name="unsafe_add")
def add_in_subprocess(a: int, b: int) -> dict:
    """Add in a subprocess."""
    return {"sum": a + b}


GOOD = [add, echo]

"""Unsafe tools that misbehave the ways issue 30 lists (importable by module path, as unsafe tools must be):
grandchildren that outlive their tool, a grandchild holding stdout open, a look at the environment."""
import os
import subprocess
import sys
import time

from slick.rollout.tools import tool

SLEEPER = [sys.executable, "-c", "import time; time.sleep(30)"]


def _spawn_sleeper(pid_file: str) -> int:
    """Start a grandchild that sleeps 30 s holding this process's stdout/stderr; write its pid to ``pid_file``."""
    child = subprocess.Popen(SLEEPER)
    with open(pid_file + ".part", "w") as fh:
        fh.write(str(child.pid))
    os.replace(pid_file + ".part", pid_file)
    return child.pid


@tool(unsafe=True, timeout=5.0)
def spawn_then_hang(pid_file: str) -> str:
    """Start a sleeping grandchild, then hang past the timeout."""
    _spawn_sleeper(pid_file)
    time.sleep(60)
    return "too late"


@tool(unsafe=True, timeout=20.0)
def spawn_and_return(pid_file: str) -> str:
    """Start a grandchild that keeps stdout open for 30 s, and return at once."""
    _spawn_sleeper(pid_file)
    return "the tool's value"


@tool(unsafe=True, timeout=60.0)
def spawn_then_wait(pid_file: str) -> str:
    """Start a sleeping grandchild, then wait a minute (for a call that is cancelled)."""
    _spawn_sleeper(pid_file)
    time.sleep(60)
    return "too late"


@tool(unsafe=True)
def environment() -> dict:
    """The whole environment the tool's process sees, and whether its HOME exists."""
    return {"env": dict(os.environ), "home_is_dir": os.path.isdir(os.environ.get("HOME", "/nonexistent"))}


@tool(unsafe=True, env=["SLICK_TEST_ALLOWED"])
def environment_with_allowed() -> dict:
    """The environment of a tool that asked for one driver variable."""
    return dict(os.environ)

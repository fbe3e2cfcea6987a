"""Tools for tests/test_sandbox.py: a sandboxed tool that runs code it is given, and one that tries to get out."""
from slick.rollout.tools import tool


@tool(sandbox=True, timeout=5.0)
def run_python(code: str) -> str:
    """Run Python code and return what it printed."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})
    return buf.getvalue()


@tool(sandbox=True, timeout=2.0)
def escape(path: str) -> dict:
    """Try to read a host file and reach the network."""
    import socket

    out = {}
    try:
        out["read"] = open(path).read()
    except OSError as e:
        out["read"] = type(e).__name__
    try:
        socket.create_connection(("127.0.0.1", 22), timeout=1)
        out["net"] = "connected"
    except OSError as e:
        out["net"] = e.errno
    return out


@tool(sandbox=True, timeout=1.5)
def hang() -> str:
    """Never return."""
    while True:
        pass

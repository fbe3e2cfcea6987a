"""A calculator served over the Model Context Protocol, written with the MCP SDK's ``MCPServer`` (mcp 2.x's name
for FastMCP). It imports nothing of slick, so it starts in a fraction of a second.

    python examples/mcp_tools/server.py                 # stdio: what `slick train --mcp-server CMD` starts
    python examples/mcp_tools/server.py --http 8000     # streamable HTTP on 127.0.0.1:8000/mcp (--mcp-url)

One tool, ``calculator(expression)``: exact arithmetic (``+ - * / // %``, ``**`` with small whole exponents,
parentheses) by walking the expression's Python AST with fractions; nothing is eval-ed, and the length and the
magnitudes are bounded. A bad expression answers with an MCP tool error (``isError``), which slick turns into an
``Error: ...`` tool message.
"""
from __future__ import annotations

import argparse
import ast
import operator
from fractions import Fraction

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
LIMIT = Fraction(10) ** 30

server = MCPServer("slick-calculator", log_level="WARNING")


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        a, b = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (b.denominator != 1 or abs(b) > 64):
            raise ToolError("exponents must be whole numbers up to 64")
        try:
            v = OPS[type(node.op)](a, b)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        if abs(v) > LIMIT:
            raise ToolError("number too large")
        return v
    raise ToolError(f"unsupported syntax: {type(node).__name__}")


@server.tool()
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses) and return its value."""
    text = expression.replace("×", "*").replace("÷", "/").replace(",", "").strip().rstrip("=")
    if not text or len(text) > 200:
        raise ToolError("expected an expression of 1 to 200 characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    v = _value(tree.body)
    return str(v.numerator) if v.denominator == 1 else f"{float(v):.6g}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on 127.0.0.1:PORT/mcp")
    a = p.parse_args(argv)
    if a.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=a.http)


if __name__ == "__main__":
    main()

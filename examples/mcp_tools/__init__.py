"""MCP tools example: the calculator task with its tool served by an MCP server over stdio (or streamable HTTP)."""

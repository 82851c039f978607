"""An MCP server written with the official SDK: echo, add, fail_once (fails on its first call
in a process), sleep (a slow tool), crash (the process exits mid-call), file
(a name to collide with), whoami (its
environment and working directory)."""

from __future__ import annotations

import asyncio
import os

from mcp.server.mcpserver import MCPServer

app = MCPServer("echo")
calls = {"fail_once": 0}


@app.tool()
def echo(message: str) -> str:
    """Echo a message back."""
    return message


@app.tool()
def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@app.tool()
def fail_once() -> str:
    """Fails on the first call of this process, then succeeds."""
    calls["fail_once"] += 1
    if calls["fail_once"] == 1:
        raise ValueError("first call fails")
    return "ok"


@app.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@app.tool()
def crash() -> str:
    """The process dies without answering."""
    os._exit(3)


@app.tool()
def file() -> str:
    """A name that, on a server called `read`, collides with the built-in read_file."""
    return "the MCP tool"


@app.tool()
def whoami() -> str:
    """The server's MCP_TEST_VALUE and working directory."""
    return f"{os.environ.get('MCP_TEST_VALUE', '')}|{os.getcwd()}|{os.getpid()}"


if __name__ == "__main__":
    app.run()

"""One MCP server over stdio: the official `mcp` SDK's ClientSession (JSON-RPC, initialize,
tools/list, tools/call) over a stdio transport of ours. Ours because the SDK's `stdio_client`
gives a server up to 2 s to exit after its stdin closes and 2 s more after SIGTERM, and a pod
must stop within 3 s even while a call runs; here the server is its own process group, killed
at once when the connection closes. Lines that are not JSON-RPC are dropped (logged): a server
that writes only garbage never answers `initialize`, which then times out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from api.tools.mcp_config import McpServerConfig

log = logging.getLogger(__name__)

KILL_GRACE_S = 0.5
MAX_LINE = 16 * 1024 * 1024


class McpConnection:
    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.session: ClientSession | None = None
        self.process: Process | None = None
        self.error = ""
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return (self.session is not None and self._task is not None and not self._task.done()
                and not self._stop.is_set())

    async def open(self, timeout_s: float) -> bool:
        """Spawn the server and initialize it within `timeout_s`; False (and `error` says
        why) if it could not."""
        self._task = asyncio.create_task(self._run(), name=f"mcp {self.config.name}")
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            self.error = self.error or "initialize timed out"
        if self.session is None:
            await self.close()
            return False
        return True

    async def _run(self) -> None:
        try:
            self.process = await anyio.open_process(
                [self.config.command, *self.config.args], cwd=self.config.cwd or None,
                env={**os.environ, **self.config.env}, start_new_session=True, stderr=None)
        except OSError as exc:
            self.error = f"failed to spawn: {exc}"
            self._ready.set()
            return
        try:
            await self._serve(self.process)
        except Exception as exc:  # the server went away or misbehaved: the calls say so
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            log.warning("MCP '%s': %s", self.config.name, self.error)
        finally:
            self.session = None
            self._stop.set()
            self._ready.set()
            await self._kill()

    async def _serve(self, process: Process) -> None:
        to_session, read_stream = anyio.create_memory_object_stream[
            SessionMessage | Exception](16)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](16)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._pump_out, process, to_session)
            tg.start_soon(self._pump_in, process, from_session)
            async with ClientSession(read_stream, write_stream) as session:
                await session.initialize()
                self.session = session
                self._ready.set()
                await self._stop.wait()
            tg.cancel_scope.cancel()

    async def _pump_out(self, process: Process,
                        to_session: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        """The server's stdout, a line a message; its end ends the connection."""
        assert process.stdout is not None
        buffer = b""
        async with to_session:
            try:
                async for chunk in process.stdout:
                    buffer += chunk
                    if len(buffer) > MAX_LINE:
                        raise ValueError("a line longer than 16 MiB")
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            await self._deliver(line, to_session)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass
            except ValueError as exc:
                self.error = str(exc)
        self.error = self.error or "transport closed"
        self._stop.set()

    async def _deliver(self, line: bytes,
                       to_session: MemoryObjectSendStream[SessionMessage | Exception]) -> None:
        try:
            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            log.warning("MCP '%s': dropped a line that is not JSON-RPC: %.120r",
                        self.config.name, line)
            return
        await to_session.send(SessionMessage(message))

    async def _pump_in(self, process: Process,
                       from_session: MemoryObjectReceiveStream[SessionMessage]) -> None:
        assert process.stdin is not None
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        self._stop.set()

    async def _kill(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            with anyio.move_on_after(KILL_GRACE_S), anyio.CancelScope(shield=True):
                await process.wait()
            if process.returncode is not None:
                return

    async def list_tools(self, timeout_s: float) -> list[types.Tool]:
        session = self.session
        if session is None:
            raise ConnectionError(self.error or "transport closed")
        result = await asyncio.wait_for(session.list_tools(), timeout_s)
        return list(result.tools)

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout_s: float
                        ) -> dict[str, Any]:
        """llama-server's answer: the text parts joined, `{"error": ...}` for an error result,
        a JSON-RPC error, a timeout or a server that went away."""
        session = self.session
        if session is None:
            return {"error": self.error or "transport closed"}
        try:
            result = await asyncio.wait_for(session.call_tool(name, arguments), timeout_s)
        except TimeoutError:
            return {"error": "request timed out"}
        except MCPError as exc:
            return {"error": exc.error.message}
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            return {"error": "transport closed"}
        if not isinstance(result, types.CallToolResult):
            return {"error": "invalid response from MCP server"}
        text = "\n".join(part.text for part in result.content
                         if isinstance(part, types.TextContent))
        if result.is_error:
            return {"error": text or "MCP tool returned an error"}
        return {"plain_text_response": text}

    async def close(self) -> None:
        self._stop.set()
        await self._kill()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 1.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 1.0)

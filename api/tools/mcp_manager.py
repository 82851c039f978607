"""The pod's MCP servers (llama-server's `server_mcp`): each spawned once at start to list its
tools (at most 10 s each, all at once) and stopped; spawned again on the first call and kept;
respawned when it died; after a failed start, refused for 5 s. Shutdown kills them all at
once, so that calls in flight end with an error and the pod stops within 3 s."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from api.tools.mcp_client import McpConnection
from api.tools.mcp_config import McpServerConfig, McpToolDef

log = logging.getLogger(__name__)

WARMUP_TIMEOUT_S = 10.0
COOLDOWN_S = 5.0


class McpManager:
    def __init__(self, configs: list[McpServerConfig]) -> None:
        self.configs = {c.name: c for c in configs}
        self.connections: dict[str, McpConnection] = {}
        self.locks = {name: asyncio.Lock() for name in self.configs}
        self.dead_until: dict[str, float] = {}
        self.stopping = False

    async def warm_up(self) -> list[McpToolDef]:
        found = await asyncio.gather(*(self._discover(c) for c in self.configs.values()))
        return [d for defs in found for d in defs]

    async def _discover(self, config: McpServerConfig) -> list[McpToolDef]:
        conn = McpConnection(config)
        budget = min(WARMUP_TIMEOUT_S, config.timeout_ms / 1000)
        deadline = time.monotonic() + budget
        try:
            if not await conn.open(budget):
                log.warning("MCP warmup: failed to start '%s': %s", config.name, conn.error)
                return []
            tools = await conn.list_tools(max(deadline - time.monotonic(), 0.1))
        except Exception as exc:
            log.warning("MCP warmup: '%s' tools/list failed: %s", config.name, exc)
            return []
        finally:
            await conn.close()
        log.info("MCP warmup: '%s' discovered %d tools", config.name, len(tools))
        return [McpToolDef(config.name, t.name, t.description or "", dict(t.input_schema or {}))
                for t in tools]

    async def _connection(self, name: str) -> McpConnection | None:
        config = self.configs.get(name)
        if config is None or self.stopping:
            return None
        async with self.locks[name]:
            if time.monotonic() < self.dead_until.get(name, 0.0):
                return None
            conn = self.connections.get(name)
            if conn is not None and conn.alive:
                return conn
            if conn is not None:
                log.warning("MCP '%s' is no longer alive: %s", name, conn.error)
                await conn.close()
                del self.connections[name]
            fresh = McpConnection(config)
            if self.stopping or not await fresh.open(config.timeout_ms / 1000):
                log.warning("MCP '%s': failed to start: %s", name, fresh.error)
                self.dead_until[name] = time.monotonic() + COOLDOWN_S
                return None
            if self.stopping:
                await fresh.close()
                return None
            self.connections[name] = fresh
            return fresh

    async def call_tool(self, server: str, tool: str, arguments: dict[str, Any]
                        ) -> dict[str, Any]:
        conn = await self._connection(server)
        if conn is None:
            return {"error": f"MCP server unavailable: {server}"}
        return await conn.call_tool(tool, arguments, self.configs[server].timeout_ms / 1000)

    async def shutdown(self) -> None:
        self.stopping = True
        connections, self.connections = list(self.connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections))

"""The tools of one api pod: the built-in ones --tools names, then the MCP servers' (each
`<server>_<tool>`, a name that is taken already skipped), the runtime they run in, and one
call's dispatch with its log line (the caller's key id, never the key)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from api.tools.errors import UnknownToolError
from api.tools.mcp_config import McpServerConfig, load_mcp_configs
from api.tools.mcp_tool import McpTool
from api.tools.paths import Confinement, OutsideRootError, resolve
from api.tools.runtime import (
    OwnedContainer,
    check_header_runtime,
    check_runtime_flag,
    make_io,
    owned_container,
)
from api.tools.threads import ToolThreads
from api.tools.tool import Json, ServerTool, ToolCall, ToolStream

if TYPE_CHECKING:
    from api.tools.mcp_manager import McpManager

log = logging.getLogger("llamaq.tools")


@dataclass(frozen=True)
class ToolsConfig:
    """What the flags ask for, checked before the pod starts (ValueError: it does not)."""

    enabled: list[str]
    runtime: str
    root: str | None
    mcp_servers: list[McpServerConfig]
    runtime_allow: list[str] = field(default_factory=list)
    ssh_config: str | None = None

    @classmethod
    def from_flags(cls, enabled: list[str], runtime: str, root: str | None,
                   mcp_config_file: str | None, mcp_json: str | None,
                   runtime_allow: list[str] | None = None,
                   ssh_config: str | None = None) -> ToolsConfig:
        # imported here, not at the top: the built-in tools (editing, search, shell: ~7 ms of
        # import CPU) are needed only where --tools is on, and this runs only then
        from api.tools.builtin.catalog import select

        select(enabled)  # an unknown tool name
        if runtime:
            check_runtime_flag(runtime)
        if root is not None and not os.path.isdir(root):
            raise ValueError(f"--tools-root: not a directory: {root}")
        if ssh_config is not None and not os.path.isfile(ssh_config):
            raise ValueError(f"--tools-ssh-config: not a file: {ssh_config}")
        return cls(enabled, runtime, root, load_mcp_configs(mcp_config_file, mcp_json),
                   [a for a in runtime_allow or [] if a], ssh_config)

    def features(self) -> list[str]:
        """What the start-up's security warning names."""
        return [name for name, on in (("server tools (experimental)", bool(self.enabled)),
                                      ("tools runtime (experimental)", bool(self.runtime)),
                                      ("MCP servers (experimental)", bool(self.mcp_servers)))
                if on]


@dataclass
class CallHeaders:
    """The request headers a call honours (llama-server's x-tool-cwd, x-tool-runtime,
    x-resp-type), and who made it."""

    cwd: str = ""
    runtime: str = ""
    resp_type: str = ""
    key_id: str = "-"


class ToolsService:
    def __init__(self, config: ToolsConfig) -> None:
        self.config = config
        self.confinement = Confinement(config.root)
        from api.tools.builtin.catalog import select  # only where --tools is on: from_flags()

        self.tools: list[ServerTool] = select(config.enabled)
        self.mcp: McpManager | None = None
        if config.mcp_servers:  # the SDK is imported only then: it adds ~1.3 s to a start
            from api.tools.mcp_manager import McpManager
            self.mcp = McpManager(config.mcp_servers)
        self.container: OwnedContainer | None = owned_container(config.runtime)
        self.threads = ToolThreads()

    async def start(self) -> None:
        """Spawn the --tools-runtime container, list the MCP servers' tools."""
        if self.container is not None:
            await self.container.spec()
        if self.mcp is None:
            return
        taken = {t.tool_name for t in self.tools}
        added = 0
        for definition in await self.mcp.warm_up():
            tool = McpTool(definition, self.mcp)
            if tool.tool_name in taken:
                log.warning("MCP tool \"%s\" from server \"%s\" collides with an existing tool, "
                            "skipping", tool.tool_name, definition.server_name)
                continue
            taken.add(tool.tool_name)
            self.tools.append(tool)
            added += 1
        if added:
            log.info("Added %d MCP tools", added)

    async def close(self) -> None:
        if self.mcp is not None:
            await self.mcp.shutdown()
        if self.container is not None:
            await self.container.close()
        self.threads.close()

    def listing(self) -> list[Json]:
        return [t.to_json() for t in self.tools]

    def find(self, name: str, stream: bool) -> ServerTool:
        for tool in self.tools:
            if tool.tool_name == name:
                if stream and not tool.support_stream:
                    raise UnknownToolError(f"tool \"{name}\" does not support stream = true")
                return tool
        raise UnknownToolError(f"unknown tool \"{name}\"")

    def check_runtime_header(self, runtime: str) -> None:
        """ToolRuntimeForbidden: `x-tool-runtime` names a runtime the operator did not allow."""
        owned = f"{self.container.engine}-container:{self.container.container_id}" \
            if self.container is not None and self.container.container_id else ""
        check_header_runtime(runtime, self.config.runtime, owned, self.config.runtime_allow)

    async def prepare(self, tool: ServerTool, params: Json, headers: CallHeaders,
                      stream: ToolStream | None = None) -> ToolCall:
        """The call (ToolRuntimeForbidden: its header names a runtime the operator did not
        allow; ToolRuntimeError: its runtime cannot be used; OutsideRootError: its cwd is
        outside --tools-root). The model's own cwd/runtime/resp_type are dropped, as
        llama-server drops them."""
        params = {k: v for k, v in params.items() if k not in ("cwd", "runtime", "resp_type")}
        self.check_runtime_header(headers.runtime)
        runtime = headers.runtime
        if not runtime and self.container is not None:
            runtime = await self.container.spec()
        elif not runtime:
            runtime = self.config.runtime
        cwd = headers.cwd
        if cwd and not runtime and self.confinement.root is not None:
            cwd = self.confinement.check(resolve(cwd, self.confinement.root))
        io = make_io(runtime, cwd, self.confinement, self.config.ssh_config)
        io.threads = self.threads
        return ToolCall(params, io, cwd, runtime, headers.resp_type, stream, headers.key_id)

    async def invoke(self, tool: ServerTool, call: ToolCall) -> Json | None:
        started = time.monotonic()
        outcome = "ok"
        try:
            result = await tool.invoke(call)
        except OutsideRootError as exc:
            result = {"error": str(exc)}
        except BaseException as exc:
            outcome = f"failed: {type(exc).__name__}"
            raise
        finally:
            log.info("tool call: key=%s tool=%s runtime=%s cwd=%s %s in %.3f s", call.key_id,
                     tool.tool_name, call.runtime or "host", call.cwd or "-", outcome,
                     time.monotonic() - started)
        if result is not None and "error" in result:
            log.info("tool call: key=%s tool=%s answered an error: %s", call.key_id,
                     tool.tool_name, str(result["error"])[:200])
        return result

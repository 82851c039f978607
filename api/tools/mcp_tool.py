"""One MCP server's tool as a pod tool: `<server>_<tool>`, type `mcp`, its input schema as the
function's parameters (llama-server's `server_mcp_tool`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.tools.mcp_config import McpToolDef
from api.tools.tool import Json, ServerTool, ToolCall

if TYPE_CHECKING:
    from api.tools.mcp_manager import McpManager


class McpTool(ServerTool):
    uses_cwd = False

    def __init__(self, definition: McpToolDef, manager: McpManager) -> None:
        self.mcp_def = definition
        self.manager = manager

    @property
    def tool_name(self) -> str:
        return f"{self.mcp_def.server_name}_{self.mcp_def.name}"

    @property
    def kind(self) -> str:
        return "mcp"

    def definition(self) -> Json:
        return {"type": "function", "function": {
            "name": self.tool_name, "description": self.mcp_def.description,
            "parameters": dict(self.mcp_def.input_schema)}}

    async def invoke(self, call: ToolCall) -> Json:
        return await self.manager.call_tool(self.mcp_def.server_name, self.mcp_def.name,
                                            call.params)

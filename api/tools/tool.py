"""A tool the pod can run: its listing entry (llama-server's `server_tool::to_json`) and its
invocation. Built-in tools (`builtin/`) and MCP servers' tools (`mcp_tools.py`) are both."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from api.tools.tools_io import ToolsIO

Json = dict[str, Any]


@dataclass
class ToolStream:
    """Where a streaming call's chunks go (SSE `{"chunk": ...}` events) and whether the client
    still listens."""

    push: Callable[[str], None]
    alive: Callable[[], bool] = lambda: True


@dataclass
class ToolCall:
    """One call: the model's parameters, and what the request's headers set (llama-server puts
    those into the parameters as `cwd`, `runtime` and `resp_type`, after erasing any the model
    sent)."""

    params: Json
    io: ToolsIO
    cwd: str = ""
    runtime: str = ""
    resp_type: str = ""
    stream: ToolStream | None = None
    key_id: str = field(default="-")  # who called, for the log (never the key itself)


class ServerTool(abc.ABC):
    name: ClassVar[str] = ""
    display_name: ClassVar[str] = ""
    uses_cwd: ClassVar[bool] = True
    permission_write: ClassVar[bool] = False
    support_stream: ClassVar[bool] = False

    @property
    def tool_name(self) -> str:
        return self.name

    @property
    def kind(self) -> str:
        return "server"

    @abc.abstractmethod
    def definition(self) -> Json: ...

    @abc.abstractmethod
    async def invoke(self, call: ToolCall) -> Json | None:
        """The result (a tool's failure is `{"error": ...}`); None for a streamed call, whose
        output went to `call.stream`."""

    def to_json(self) -> Json:
        return {
            "display_name": self.display_name or self.tool_name,
            "tool": self.tool_name,
            "type": self.kind,
            "permissions": {"write": self.permission_write},
            "uses_cwd": self.uses_cwd,
            "definition": self.definition(),
        }


def function(name: str, description: str, properties: Json,
             required: list[str] | None = None) -> Json:
    """An OpenAI function definition, as llama-server writes its tools'."""
    parameters: Json = {"type": "object", "properties": properties}
    if required is not None:
        parameters["required"] = required
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


def prop(kind: str, description: str) -> Json:
    return {"type": kind, "description": description}

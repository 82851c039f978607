"""The built-in tools, in llama-server's order, and `--tools` (a comma list, or `all`)."""

from __future__ import annotations

from api.tools.builtin.edit_file import EditFile
from api.tools.builtin.read_write import ReadFile, WriteFile
from api.tools.builtin.search import FileGlobSearch, GrepSearch
from api.tools.builtin.shell import ExecShellCommand, GetInfo
from api.tools.tool import ServerTool

BUILTIN_TOOLS: tuple[type[ServerTool], ...] = (
    ReadFile, FileGlobSearch, GrepSearch, ExecShellCommand, WriteFile, EditFile, GetInfo,
)
BUILTIN_NAMES: tuple[str, ...] = tuple(t.name for t in BUILTIN_TOOLS)


def unknown_tools(enabled: list[str]) -> list[str]:
    return [n for n in enabled if n != "all" and n not in BUILTIN_NAMES]


def unknown_tool_message(name: str) -> str:
    return f"unknown tool \"{name}\". available tools: {', '.join(BUILTIN_NAMES)}"


def select(enabled: list[str]) -> list[ServerTool]:
    """The tools `--tools` names (an unknown name: ValueError, which stops the start)."""
    for name in unknown_tools(enabled):
        raise ValueError(unknown_tool_message(name))
    return [t() for t in BUILTIN_TOOLS if "all" in enabled or t.name in enabled]

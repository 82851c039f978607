"""OpenAI chat input: tools and tool_choice, and their validation. `validate_tools` returns
the tools as the chat template and the tool grammar take them; `validate_tool_choice` checks
tool_choice against them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from api.chat.messages import Wire, dump_json, errors_at
from scheduler.contract.errors import InvalidRequest

TOOL_CHOICE_MODES = ("auto", "none", "required")


class FunctionDef(Wire):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Wire):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Wire):
    name: str


class NamedToolChoice(Wire):
    type: Literal["function"]
    function: NamedFunction


ToolChoiceIn = Literal["auto", "none", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolChoice:
    """A checked tool_choice: `mode` "required" with a `name` means that function must be called."""

    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None

def _check_parameters(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A tool's parameters must be an object schema; absent or {} means no parameters."""
    if not parameters:
        return {"type": "object", "properties": {}}
    kind = parameters.get("type", "object")
    kinds = kind if isinstance(kind, list) else [kind]
    if "object" not in kinds:
        raise InvalidRequest(
            f"Invalid tool '{name}': 'parameters' must be a JSON schema of type 'object', "
            f"got type {dump_json(kind)}"
        )
    if not isinstance(parameters.get("properties", {}), dict):
        raise InvalidRequest(f"Invalid tool '{name}': 'parameters.properties' must be an object")
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise InvalidRequest(
            f"Invalid tool '{name}': 'parameters.required' must be an array of strings"
        )
    return parameters


def _to_tool(index: int, raw: Tool | Mapping[str, Any]) -> Tool:
    if isinstance(raw, Tool):
        return raw
    if not isinstance(raw, Mapping):
        raise InvalidRequest(f"Failed to parse tools: expected an object, got {dump_json(raw)}")
    if "type" not in raw:
        raise InvalidRequest(f"Failed to parse tools: Missing tool type: {dump_json(raw)}")
    if raw["type"] != "function":
        raise InvalidRequest(f"Failed to parse tools: Unsupported tool type: {dump_json(raw)}")
    if "function" not in raw:
        raise InvalidRequest(f"Failed to parse tools: Missing tool function: {dump_json(raw)}")
    function = raw["function"]
    if (
        isinstance(function, Mapping)
        and "parameters" in function
        and not isinstance(function["parameters"], Mapping | None)
    ):
        name = function.get("name")
        raise InvalidRequest(
            f"Invalid tool '{name}': 'parameters' must be a JSON schema object, "
            f"got {dump_json(function['parameters'])}"
        )
    try:
        return Tool.model_validate(raw)
    except ValidationError as exc:
        raise InvalidRequest(errors_at(exc, f"tools[{index}]")) from None


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """Check `tools`; return them as OpenAI tool dicts for the template and the grammar
    (`parameters` always an object schema, `description` always a string)."""
    if tools is None:
        return []
    if not isinstance(tools, Sequence) or isinstance(tools, str | bytes):
        raise InvalidRequest(f"Expected 'tools' to be an array, got {dump_json(tools)}")
    out = []
    seen: set[str] = set()
    for index, raw in enumerate(tools):
        tool = _to_tool(index, raw)
        name = tool.function.name
        if not name.strip():
            raise InvalidRequest(f"tools[{index}]: the function name must not be empty")
        if name in seen:
            raise InvalidRequest(f"tools[{index}]: duplicate function name '{name}'")
        seen.add(name)
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": tool.function.description or "",
                    "parameters": _check_parameters(name, tool.function.parameters),
                },
            }
        )
    return out


def tool_names(tools: Sequence[Mapping[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def validate_tool_choice(tool_choice: Any, tools: Sequence[Mapping[str, Any]]) -> ToolChoice:
    """Check `tool_choice` against the validated `tools` (from `validate_tools`)."""
    if tool_choice is None:
        return ToolChoice("auto")
    if isinstance(tool_choice, NamedToolChoice):
        name: Any = tool_choice.function.name
    elif isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICE_MODES:
            raise InvalidRequest(f"Invalid tool_choice: {tool_choice}")
        if tool_choice == "required" and not tools:
            raise InvalidRequest("tool_choice 'required' needs at least one tool in 'tools'")
        return ToolChoice(tool_choice)  # type: ignore[arg-type]
    elif isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        # the Responses API names the function at the top level
        name = function.get("name") if isinstance(function, Mapping) else tool_choice.get("name")
    else:
        raise InvalidRequest(f"Invalid tool_choice: {dump_json(tool_choice)}")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"Invalid tool_choice: no function name in {dump_json(tool_choice)}")
    if name not in tool_names(tools):
        raise InvalidRequest(f"Invalid tool_choice: tool '{name}' is not in 'tools'")
    return ToolChoice("required", name)

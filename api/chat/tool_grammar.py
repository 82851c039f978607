"""Constraining the output to a tool call when `tool_choice` demands one.

The constraint is llama.cpp's "generic" tool-call format (common/chat.cpp, for templates without
native tool support): a JSON object `{"tool_call": {"name", "arguments"}}`, or with parallel calls
`{"tool_calls": [{"name", "arguments"}, ...]}`. It is produced as a JSON schema (the worker turns
`job.json_schema` into a grammar), together with the system-prompt line llama.cpp adds so the
model knows the format. `ChatOutputParser` reads this format back. A template whose family
writes its calls as JSON in its own markers (`CallFrame`, chat_formats.py) is forced to that
format instead, as llama-server's format grammar forces it: the schema of the calls, framed by
the markers (the worker's `json_schema_frame`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from api.chat.request_tools import ToolChoice, validate_tool_choice

TAGGED_ARGUMENTS = "x-llamaq-tagged-arguments"
"""The key of a function's schema whose arguments the forced call writes as tagged pairs
(its value: the pairs' markers; the worker's worker/engine/tagged_grammar.py `TAGGED`)."""

GENERIC_TOOL_HINT = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` "
    "reply to the user's request"
)
GENERIC_TOOL_HINT_REQUIRED = "Respond in JSON format with `tool_call` (a request to call tools)"
GENERIC_TOOL_HINT_PARALLEL = "Respond in JSON format with `tool_calls` (a list of tool calls)"


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    function = tool.get("function", tool)
    return function if isinstance(function, Mapping) else {}


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = _function(tool)
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "const": function["name"]},
            "arguments": parameters,
        },
        "required": ["name", "arguments"],
    }
    if function.get("description"):
        schema["description"] = function["description"]
    return schema


def tool_call_schema(
    tools: Sequence[Mapping[str, Any]], *, parallel_tool_calls: bool
) -> dict[str, Any]:
    """The generic format's schema for a call to one of `tools` (validated tool dicts)."""
    calls = [_call_schema(tool) for tool in tools]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel_tool_calls:
        return {
            "type": "object",
            "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
            "required": ["tool_calls"],
        }
    return {"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]}


@dataclass(frozen=True)
class CallFrame:
    """How a template's family writes a forced tool call when its calls are JSON: between
    `prefix` and `suffix`, the call objects of `shape` (`name_arguments`: {"name",
    "arguments"}; `name_parameters`: {"name", "parameters"}; `r7b`: {"tool_call_id",
    "tool_name", "parameters"}; `apertus`: {NAME: arguments}; `arguments`: the arguments
    alone, the function's name in the markers: `prefix`, the name, `after_name`), one JSON
    array of them when `listed`, else one object per block (blocks repeated after `separator`
    for parallel calls)."""

    prefix: str
    suffix: str = ""
    shape: str = "name_arguments"
    listed: bool = False
    separator: str = ""
    after_name: str = ""
    tagged: tuple[str, str, str] | None = None
    """Shape `arguments` written as tagged pairs, not JSON: (the key's prefix, what is between
    the key and its value, the value's closing marker)."""


def _shaped_call(tool: Mapping[str, Any], shape: str) -> dict[str, Any]:
    function = _function(tool)
    name = function["name"]
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if shape == "arguments":  # the name is in the frame's markers (autoparse/forced.py)
        return dict(parameters)
    if shape == "apertus":
        return {"type": "object", "properties": {name: parameters}, "required": [name]}
    if shape == "r7b":
        properties = {"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                      "tool_name": {"type": "string", "const": name}, "parameters": parameters}
    else:
        key = "parameters" if shape == "name_parameters" else "arguments"
        properties = {"name": {"type": "string", "const": name}, key: parameters}
    return {"type": "object", "properties": properties, "required": list(properties)}


def native_tool_call(tools: Sequence[Mapping[str, Any]], choice: ToolChoice,
                     parallel_tool_calls: bool, frame: CallFrame) -> tuple[str, list[str]]:
    """(JSON schema as JSON text, the job's `json_schema_frame`) forcing a call in the
    template's own format (`tool_choice` "required" or a named function), as llama-server's
    grammar for the format forces it (no system-prompt line). Where the markers name the
    function (shape `arguments`), each function is one alternative of the schema's `anyOf`,
    written after its own markers: the frame's entries past the third, in the same order."""
    if choice.name is not None:
        tools = [tool for tool in tools if _function(tool).get("name") == choice.name]
    calls = [_shaped_call(tool, frame.shape) for tool in tools]
    if frame.tagged is not None:  # the worker writes these pairs (worker/engine/tagged_grammar)
        calls = [{**call, TAGGED_ARGUMENTS: list(frame.tagged)} for call in calls]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if frame.shape == "arguments":
        named = [str(_function(tool)["name"]) + frame.after_name for tool in tools]
        if len(named) == 1 and frame.tagged is None:
            return json.dumps(one, ensure_ascii=False), [frame.prefix + named[0], frame.suffix,
                                                         ""]
        return json.dumps({"anyOf": calls}, ensure_ascii=False), [frame.prefix, frame.suffix, "",
                                                                  *named]
    if frame.listed:
        one = {"type": "array", "items": one, "minItems": 1,
               **({} if parallel_tool_calls else {"maxItems": 1})}
    separator = frame.separator if parallel_tool_calls and not frame.listed else ""
    return json.dumps(one, ensure_ascii=False), [frame.prefix, frame.suffix, separator]


def tool_call_grammar(
    tools: Sequence[Mapping[str, Any]],
    tool_choice: ToolChoice | str | Mapping[str, Any] | None,
    parallel_tool_calls: bool,
) -> tuple[str | None, str | None]:
    """(JSON schema as JSON text, system-prompt line) forcing a tool call, or (None, None).

    A constraint is needed when `tool_choice` is "required" (any of `tools`) or names a function
    (only that one). `tools` are the dicts `validate_tools` returns. Put the schema in
    `CompletionJob.json_schema` and add the line to the system prompt with `add_system_hint`.
    """
    choice = (
        tool_choice
        if isinstance(tool_choice, ToolChoice)
        else validate_tool_choice(tool_choice, tools)
    )
    if choice.mode != "required" or not tools:
        return None, None
    if choice.name is not None:
        tools = [tool for tool in tools if _function(tool).get("name") == choice.name]
    schema = tool_call_schema(tools, parallel_tool_calls=parallel_tool_calls)
    hint = GENERIC_TOOL_HINT_PARALLEL if parallel_tool_calls else GENERIC_TOOL_HINT_REQUIRED
    return json.dumps(schema, ensure_ascii=False), hint


def add_system_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """Messages with `hint` appended to the first system message (or a new one in front), as
    llama.cpp's `add_system` does."""
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        existing = first.get("content") or ""
        content = f"{existing}\n\n{hint}" if existing else hint
        return [{**first, "content": content}, *messages[1:]]
    return [{"role": "system", "content": hint}, *messages]

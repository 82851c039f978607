"""The ways a tool call fails before its tool answers, as llama-server sorts them
(`server-tools.cpp` handle_post): a bad argument or body (400), an unknown tool or a stream it
cannot do (404, its body still says code 400), a runtime that cannot be used (500); ours: a
runtime the caller may not name (403). A tool that
runs and fails answers 200 with `{"error": ...}` instead: that is its result, not one of these."""

from __future__ import annotations


class ToolArgumentError(Exception):
    """A body or a parameter of the wrong shape, or a required one missing (llama-server's
    JSON errors, worded as nlohmann::json words them)."""


class UnknownToolError(Exception):
    """No tool of that name, or `stream` asked of a tool that does not stream."""


class ToolRuntimeError(Exception):
    """The runtime a call asks for (`x-tool-runtime`, --tools-runtime) is malformed, not
    supported, or its container could not be reached."""


class ToolRuntimeForbidden(Exception):
    """ours: an `x-tool-runtime` header that names neither --tools-runtime nor a runtime of
    --tools-runtime-allow (a 403: a caller does not choose where the pod runs commands)."""


def missing_key(key: str) -> ToolArgumentError:
    return ToolArgumentError(f"[json.exception.out_of_range.403] key '{key}' not found")


def wrong_type(expected: str, got: object) -> ToolArgumentError:
    return ToolArgumentError(f"[json.exception.type_error.302] type must be {expected}, "
                             f"but is {json_type_name(got)}")


def json_type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"

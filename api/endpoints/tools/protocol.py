"""The /tools wire models: a call's body, read as llama-server reads it (`tool` required,
`params` an object, `stream` a boolean; every error a 400 worded as nlohmann::json words it)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from api.tools.errors import ToolArgumentError, json_type_name, missing_key, wrong_type
from scheduler.contract.deferred import DeferredModel


class ToolCallRequest(DeferredModel):
    """POST /tools: run one tool."""

    tool: str = Field(description="the tool's name, as GET /tools lists it")
    params: dict[str, Any] = Field(default_factory=dict, description="the tool's arguments")
    stream: bool = Field(False, description="SSE chunks as the tool runs (exec_shell_command "
                         "only)")


def read_call(raw: bytes) -> ToolCallRequest:
    try:
        body = json.loads(raw or b"")
    except ValueError as exc:
        raise ToolArgumentError(f"[json.exception.parse_error.101] parse error: {exc}") from None
    if not isinstance(body, dict):
        raise ToolArgumentError(f"[json.exception.type_error.304] cannot use at() with "
                                f"{json_type_name(body)}")
    if "tool" not in body:
        raise missing_key("tool")
    if not isinstance(body["tool"], str):
        raise wrong_type("string", body["tool"])
    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ToolArgumentError(f"[json.exception.type_error.305] cannot use operator[] with a "
                                f"string argument with {json_type_name(params)}")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise wrong_type("boolean", stream)
    return ToolCallRequest(tool=body["tool"], params=params, stream=stream)

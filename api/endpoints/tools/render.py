"""The /tools answers' shapes, as llama-server's: the listing is the tools' own JSON; a call's
errors are `{code, message, type}` at the top level (not inside `error`); a disabled feature is
403 `{"error": {"message", "type": "feature_disabled"}}`; a stream is `{"chunk": ...}` events,
then `{"done": true}` (with `error` when the tool failed)."""

from __future__ import annotations

from typing import Any

from sanic.response import HTTPResponse, json

from scheduler.contract.errors import InvalidRequest, PermissionDenied, ServerError

FEATURE_DISABLED = {"error": {"message": "this feature is disabled", "type": "feature_disabled"}}


def feature_disabled() -> HTTPResponse:
    return json(FEATURE_DISABLED, status=403)


def bad_request(message: str, status: int = 400) -> HTTPResponse:
    """400 for a bad body or argument, 404 for an unknown tool (its body still says 400)."""
    return json(InvalidRequest(message).to_info().to_wire(), status=status)


def forbidden(message: str) -> HTTPResponse:
    """ours: 403 `permission_error` for a runtime header the operator did not allow."""
    return json(PermissionDenied(message).to_info().to_wire(), status=403)


def unsupported_media_type() -> HTTPResponse:
    """ours: 415 for a call whose body is not `application/json`."""
    message = "the body of a tool call must be application/json"
    return json(InvalidRequest(message, status=415).to_info().to_wire(), status=415)


def server_error(message: str) -> HTTPResponse:
    return json(ServerError(message).to_info().to_wire(), status=500)


def chunk_event(chunk: str) -> dict[str, Any]:
    return {"chunk": chunk}


def done_event(error: str = "") -> dict[str, Any]:
    return {"done": True, **({"error": error} if error else {})}

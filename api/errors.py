"""Rendering errors in the spec's format, as JSON bodies or as SSE error events."""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError
from sanic import Request, Sanic
from sanic.exceptions import SanicException
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from scheduler.contract.errors import (
    InvalidRequest,
    LlamaqError,
    NotFound,
    ServerError,
    Unavailable,
)
from scheduler.redis_errors import translate
from storage import StorageError

log = logging.getLogger(__name__)


def error_body(error: LlamaqError) -> dict[str, Any]:
    return {"error": error.to_info().to_wire()}


def error_response(error: LlamaqError) -> HTTPResponse:
    headers = {} if error.retry_after_s is None else {"Retry-After": str(error.retry_after_s)}
    return json_response(error_body(error), status=error.status, headers=headers)


def sse_error(error: LlamaqError) -> str:
    """An error after a stream has started, in the native/OpenAI stream framing."""
    return f"data: {json.dumps(error_body(error))}\n\n"


def validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "Invalid request: " + "; ".join(parts)


def as_llamaq_error(exc: Exception) -> LlamaqError:
    """Map anything a handler raised to one of our errors (third-party ones at this edge)."""
    if isinstance(exc, RedisError):
        log.warning("Redis error: %r", exc)
    elif isinstance(exc, StorageError):
        log.debug("storage error: %s", exc)
    ours = translate(exc)  # the translation the worker uses too
    if ours is not None:
        return ours
    if isinstance(exc, ValidationError):
        return InvalidRequest(validation_message(exc))
    if isinstance(exc, SanicException):
        if exc.status_code == 404:
            return NotFound("File Not Found")
        if exc.status_code < 500:
            return InvalidRequest(str(exc), status=exc.status_code)
        if exc.status_code == 503:  # Sanic's response timeout: -to, --timeout
            return Unavailable(f"{exc}: nothing was sent or received for --timeout seconds")
    log.exception("unexpected error", exc_info=exc)
    return ServerError(f"Internal server error: {type(exc).__name__}")


def install_error_handler(app: Sanic) -> None:
    async def handle(request: Request, exc: Exception) -> HTTPResponse:
        return error_response(as_llamaq_error(exc))

    app.error_handler.add(Exception, handle)

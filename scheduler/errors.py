"""The one error hierarchy of llamaq.

Each error class declares its HTTP status and the spec's error `type`. Workers send errors as
`ErrorInfo` inside error events; the api turns them back into these classes and renders them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, Field
from redis.exceptions import RedisError

from storage import StorageError
from storage.redact import redact


class ErrorInfo(BaseModel):
    """An error as it crosses Redis and as the spec renders it (`{"error": {...}}`)."""

    code: int
    message: str
    type: str
    extra: dict[str, int | str] = Field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "type": self.type, **self.extra}


class LlamaqError(Exception):
    status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, retry_after_s: int | None = None,
                 **extra: int | str) -> None:
        """`retry_after_s`: sent as the response's Retry-After header (not in the body)."""
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.extra = extra

    def to_info(self) -> ErrorInfo:
        return ErrorInfo(
            code=self.status, message=self.message, type=self.error_type, extra=self.extra
        )


class InvalidRequest(LlamaqError):
    status = 400
    error_type = "invalid_request_error"


class ExceedContextSize(LlamaqError):
    status = 400
    error_type = "exceed_context_size_error"


class AuthenticationFailed(LlamaqError):
    status = 401
    error_type = "authentication_error"


class NotFound(LlamaqError):
    status = 404
    error_type = "not_found_error"


class NotSupported(LlamaqError):
    status = 501
    error_type = "not_supported_error"


class Unavailable(LlamaqError):
    status = 503
    error_type = "unavailable_error"


class RedisUnreachable(Unavailable):
    """Redis cannot be reached (down, restarting, failing over): worth a retry soon."""

    RETRY_AFTER_S = 5

    def __init__(self, message: str = "the job queue (Redis) is unreachable; retry later",
                 **extra: int | str) -> None:
        super().__init__(message, retry_after_s=self.RETRY_AFTER_S, **extra)


class ServerError(LlamaqError):
    status = 500
    error_type = "server_error"


_BY_TYPE: dict[str, type[LlamaqError]] = {
    cls.error_type: cls
    for cls in (
        InvalidRequest,
        ExceedContextSize,
        AuthenticationFailed,
        NotFound,
        NotSupported,
        Unavailable,
        ServerError,
    )
}


def error_from_info(info: ErrorInfo) -> LlamaqError:
    """Rebuild the typed error a worker reported (a known type keeps its status, should it not
    be the class's own; an unknown one is a 500)."""
    error = _BY_TYPE.get(info.type, ServerError)(info.message, **info.extra)  # type: ignore[arg-type]
    if info.type in _BY_TYPE and info.code != error.status:
        error.status = info.code  # type: ignore[misc]
    return error


def translate(error: BaseException) -> LlamaqError | None:
    """The one translation into ours, used by the api and the worker alike: ours as they are,
    Redis errors as RedisUnreachable, object-storage errors with the status and type they
    declare (`http_status`, `error_type`) and a redacted message; None for anything else
    (a bug, which the caller reports as a 500)."""
    if isinstance(error, LlamaqError):
        return error
    if isinstance(error, RedisError):
        return RedisUnreachable()
    if isinstance(error, StorageError):
        translated = _BY_TYPE.get(error.error_type, ServerError)(
            f"object storage: {redact(str(error))}")
        if error.http_status != translated.status:
            translated.status = error.http_status  # type: ignore[misc]
        return translated
    return None

"""The one error table of llamaq: every error class, its HTTP status and the spec's error `type`.

Each error class declares its status and type. Workers send errors as `ErrorInfo` inside error
events; the api turns them back into these classes and renders them. Errors raised below the
roles (object storage) name the class of this table they are rendered as (`MappedError`), so
the table is declared once. Errors of a library (Redis's) are translated by the layer that uses
that library (scheduler/redis_errors.py): the contract imports none.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from scheduler.contract.deferred import DeferredModel


class ErrorInfo(DeferredModel):
    """An error as it crosses Redis and as the spec renders it (`{"error": {...}}`)."""

    code: int
    message: str
    type: str
    extra: dict[str, int | str] = Field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "type": self.type, **self.extra}


class LlamaqError(Exception):
    status: int = 500
    error_type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, retry_after_s: int | None = None,
                 status: int | None = None, **extra: int | str) -> None:
        """`retry_after_s`: sent as the response's Retry-After header (not in the body);
        `status`: this error's own HTTP status, where it is not the class's (a framework's
        4xx, a status an error reported from elsewhere kept)."""
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.extra = extra
        if status is not None:
            self.status = status

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


class PermissionDenied(LlamaqError):
    """The caller may not do this (llama-server's ERROR_TYPE_PERMISSION): a tool runtime the
    operator did not allow; under --tenants, what changes the fleet for everyone is the admin
    tenant's."""

    status = 403
    error_type = "permission_error"


class NotFound(LlamaqError):
    status = 404
    error_type = "not_found_error"


class Conflict(InvalidRequest):
    """The request cannot be done in the present state (a download paused or cancelled)."""

    status = 409


class RateLimited(LlamaqError):
    """A tenant over one of its limits (--tenants): 429 with Retry-After, OpenAI's
    `rate_limit_exceeded`."""

    status = 429
    error_type = "rate_limit_exceeded"


class NotSupported(LlamaqError):
    status = 501
    error_type = "not_supported_error"


class Unavailable(LlamaqError):
    status = 503
    error_type = "unavailable_error"


class Preempted(Unavailable):
    """A running generation gave its slot to a more urgent job (--preempt, docs/fairness.md):
    never sent to a client. The worker's publisher turns its cancel event into a hand back:
    the job goes back to its queue and continues from its generated tokens."""

    error_type = "preempted"


class RedisUnreachable(Unavailable):
    """Redis cannot be reached (down, restarting, failing over): worth a retry soon."""

    RETRY_AFTER_S = 5

    def __init__(self, message: str = "the job queue (Redis) is unreachable; retry later",
                 **extra: int | str) -> None:
        super().__init__(message, retry_after_s=self.RETRY_AFTER_S)
        self.extra = extra


class ServerError(LlamaqError):
    status = 500
    error_type = "server_error"


class BadGateway(ServerError):
    """An origin llamaq fetched from failed or sent something wrong (a download, a checksum)."""

    status = 502


ERROR_TABLE: tuple[type[LlamaqError], ...] = (
    InvalidRequest, ExceedContextSize, AuthenticationFailed, PermissionDenied, NotFound,
    Conflict, RateLimited, NotSupported, Unavailable, ServerError, BadGateway,
)
"""Every class an error is rendered as, each with its own (status, type)."""

_BY_STATUS_TYPE: dict[tuple[int, str], type[LlamaqError]] = {
    (cls.status, cls.error_type): cls for cls in ERROR_TABLE
}
_BY_TYPE: dict[str, type[LlamaqError]] = {}
for _cls in ERROR_TABLE:  # a type's first class is its base (InvalidRequest before Conflict)
    _BY_TYPE.setdefault(_cls.error_type, _cls)


class MappedError(Exception):
    """An error raised below the roles (object storage) that names the class of the table it
    is rendered as; `translate` turns it into that class with its `public_message`."""

    renders_as: ClassVar[type[LlamaqError]] = ServerError

    def public_message(self) -> str:
        """What of the error may leave the process."""
        return str(self)

    def to_llamaq(self) -> LlamaqError:
        return self.renders_as(self.public_message())


def error_from_info(info: ErrorInfo) -> LlamaqError:
    """Rebuild the typed error a worker reported: the class of its (status, type); a known type
    with another status keeps that status; an unknown type is a 500."""
    extra: dict[str, Any] = dict(info.extra)
    cls = _BY_STATUS_TYPE.get((info.code, info.type))
    if cls is not None:
        return cls(info.message, **extra)
    if info.type in _BY_TYPE:
        return _BY_TYPE[info.type](info.message, status=info.code, **extra)
    return ServerError(info.message, **extra)


def translate(error: BaseException) -> LlamaqError | None:
    """Ours as they are, mapped errors (object storage) as the class they name, with the
    message they allow out; None for anything else. Redis's errors are the scheduler's to
    translate (scheduler/redis_errors.py `translate`, which the api and the worker call)."""
    if isinstance(error, LlamaqError):
        return error
    if isinstance(error, MappedError):
        return error.to_llamaq()
    return None

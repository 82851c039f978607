"""The error hierarchy: status and type per class, and the trip through ErrorInfo."""

from __future__ import annotations

import pytest

from scheduler.contract.errors import (
    AuthenticationFailed,
    ErrorInfo,
    ExceedContextSize,
    InvalidRequest,
    LlamaqError,
    NotFound,
    NotSupported,
    ServerError,
    Unavailable,
    error_from_info,
)

SPEC = [
    (InvalidRequest, 400, "invalid_request_error"),
    (ExceedContextSize, 400, "exceed_context_size_error"),
    (AuthenticationFailed, 401, "authentication_error"),
    (NotFound, 404, "not_found_error"),
    (NotSupported, 501, "not_supported_error"),
    (Unavailable, 503, "unavailable_error"),
    (ServerError, 500, "server_error"),
]


@pytest.mark.parametrize(("cls", "status", "error_type"), SPEC)
def test_each_class_declares_status_and_type(cls: type[LlamaqError], status: int,
                                             error_type: str) -> None:
    assert cls.status == status
    assert cls.error_type == error_type
    assert issubclass(cls, LlamaqError)


@pytest.mark.parametrize(("cls", "status", "error_type"), SPEC)
def test_round_trip_keeps_class_status_type_and_extra(cls: type[LlamaqError], status: int,
                                                      error_type: str) -> None:
    error = cls("boom", n_prompt_tokens=12, where="here")
    info = error.to_info()
    assert (info.code, info.type, info.message) == (status, error_type, "boom")
    assert info.extra == {"n_prompt_tokens": 12, "where": "here"}
    back = error_from_info(ErrorInfo.model_validate_json(info.model_dump_json()))
    assert type(back) is cls
    assert (back.status, back.error_type, back.message) == (status, error_type, "boom")
    assert back.extra == {"n_prompt_tokens": 12, "where": "here"}
    assert str(back) == "boom"


def test_unknown_type_becomes_server_error() -> None:
    info = ErrorInfo(code=418, message="teapot", type="teapot_error", extra={"k": 1})
    error = error_from_info(info)
    assert type(error) is ServerError
    assert (error.status, error.error_type, error.message) == (500, "server_error", "teapot")
    assert error.extra == {"k": 1}


def test_to_wire_flattens_extra() -> None:
    error = ExceedContextSize("the request exceeds the available context size",
                              n_prompt_tokens=5000, n_ctx=4096)
    assert error.to_info().to_wire() == {
        "code": 400,
        "message": "the request exceeds the available context size",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 5000,
        "n_ctx": 4096,
    }


def test_to_wire_without_extra_has_exactly_three_keys() -> None:
    assert NotFound("gone").to_info().to_wire() == {
        "code": 404, "message": "gone", "type": "not_found_error",
    }


def test_extra_keeps_int_and_str_types_through_json() -> None:
    info = InvalidRequest("x", count=3, name="7").to_info()
    back = ErrorInfo.model_validate_json(info.model_dump_json())
    assert back.extra == {"count": 3, "name": "7"}
    assert isinstance(back.extra["count"], int)
    assert isinstance(back.extra["name"], str)

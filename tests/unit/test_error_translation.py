"""One translation of Redis and object-storage errors into ours, for api and worker alike:
a storage error keeps the status and type it declares (`http_status`, `error_type`) on the
way to the client, with its message redacted."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from api.errors import as_llamaq_error
from scheduler.errors import (
    InvalidRequest,
    NotFound,
    RedisUnreachable,
    ServerError,
    Unavailable,
    error_from_info,
    translate,
)
from storage import InvalidKey, ObjectNotFound, StorageError, StorageUnavailable


@pytest.mark.parametrize(("error", "cls"), [
    (ObjectNotFound("'slots/a.bin' not found in /srv/secret/store"), NotFound),
    (StorageUnavailable("s3://bucket-x/prefix: timed out"), Unavailable),
    (InvalidKey("invalid slot file name 'a/b'"), InvalidRequest),
    (StorageError("something odd at /srv/secret"), ServerError),
])
def test_storage_errors_keep_their_declared_status(error: StorageError,
                                                    cls: type[Exception]) -> None:
    for translated in (translate(error), as_llamaq_error(error)):
        assert isinstance(translated, cls)
        assert translated.status == error.http_status
        assert translated.error_type == error.error_type
        assert translated.message.startswith("object storage: ")
        assert "/srv/secret" not in translated.message and "bucket-x" not in translated.message


def test_a_status_outside_the_hierarchy_survives_the_trip_through_redis() -> None:
    class Conflict(StorageError):
        http_status = 409
        error_type = "invalid_request_error"

    translated = translate(Conflict("busy"))
    assert translated is not None and translated.status == 409
    back = error_from_info(translated.to_info())
    assert isinstance(back, InvalidRequest) and back.status == 409


def test_redis_errors_are_unreachable_and_others_are_not_ours() -> None:
    assert isinstance(translate(RedisConnectionError("refused")), RedisUnreachable)
    error = InvalidRequest("bad")
    assert translate(error) is error
    assert translate(ValueError("a bug")) is None


def test_a_result_of_another_kind_is_a_500_not_an_assert() -> None:
    from scheduler.results import DetokenizeResult, TokenizeResult, expect_result

    result = TokenizeResult(tokens=[1, 2])
    assert expect_result(result, TokenizeResult) is result
    with pytest.raises(ServerError, match="TokenizeResult, not a DetokenizeResult"):
        expect_result(result, DetokenizeResult)

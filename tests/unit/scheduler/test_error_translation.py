"""One translation of Redis and object-storage errors into ours, for api and worker alike:
a storage error is rendered as the class of the one table it names (`renders_as`), with its
message redacted."""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from api.errors import as_llamaq_error
from scheduler.contract.errors import (
    ERROR_TABLE,
    BadGateway,
    Conflict,
    InvalidRequest,
    NotFound,
    RedisUnreachable,
    ServerError,
    Unavailable,
    error_from_info,
)
from scheduler.redis_errors import translate
from storage import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadFailed,
    InvalidKey,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
)


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
        assert type(translated) is error.renders_as is cls
        assert translated.message.startswith("object storage: ")
        assert "/srv/secret" not in translated.message and "bucket-x" not in translated.message


@pytest.mark.parametrize(("error", "cls", "status"), [
    (DownloadCancelled("paused"), Conflict, 409),
    (DownloadFailed("origin said 500"), BadGateway, 502),
    (ChecksumMismatch("sha256 differs"), BadGateway, 502),
])
def test_storage_statuses_beside_the_base_ones_survive_the_trip_through_redis(
        error: StorageError, cls: type[Exception], status: int) -> None:
    translated = translate(error)
    assert type(translated) is cls and translated.status == status
    back = error_from_info(translated.to_info())
    assert type(back) is cls and back.status == status


def test_a_known_type_with_a_status_of_its_own_keeps_it() -> None:
    error = InvalidRequest("Method Not Allowed", status=405)
    back = error_from_info(error.to_info())
    assert type(back) is InvalidRequest and back.status == 405
    assert InvalidRequest.status == 400  # the class is untouched


def test_every_class_of_the_table_has_its_own_status_and_type() -> None:
    pairs = [(cls.status, cls.error_type) for cls in ERROR_TABLE]
    assert len(set(pairs)) == len(pairs)


def test_redis_errors_are_unreachable_and_others_are_not_ours() -> None:
    assert isinstance(translate(RedisConnectionError("refused")), RedisUnreachable)
    error = InvalidRequest("bad")
    assert translate(error) is error
    assert translate(ValueError("a bug")) is None


def test_a_result_of_another_kind_is_a_500_not_an_assert() -> None:
    from scheduler.contract.results import DetokenizeResult, TokenizeResult, expect_result

    result = TokenizeResult(tokens=[1, 2])
    assert expect_result(result, TokenizeResult) is result
    with pytest.raises(ServerError, match="TokenizeResult, not a DetokenizeResult"):
        expect_result(result, DetokenizeResult)

"""The job wire (scheduler/queueing.py): JSON both ways, and arq's record of a job it could not
start (its exception as the result) written without a traceback."""

from __future__ import annotations

import logging

import pytest
from arq.jobs import serialize_result
from arq.worker import JobExecutionFailed

from scheduler.queueing import deserialize_job, serialize_job


def test_a_job_goes_and_comes_back_as_json() -> None:
    data = {"t": 1, "f": "completion", "a": [{"prompt": "hi", "n_predict": 3}], "k": {}}
    assert serialize_job(data).startswith(b'{"t":1,')
    assert deserialize_job(serialize_job(data)) == data


def test_the_result_of_an_expired_job_is_its_exception_in_words(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="arq.jobs"):
        record = serialize_result("<unknown>", (), {}, 1, 0, False,
                                  JobExecutionFailed("job expired"), 0, 1, "j:<unknown>",
                                  "arq:queue", "j", serializer=serialize_job)
    assert record is not None
    assert deserialize_job(record)["r"] == "JobExecutionFailed('job expired')"
    assert not caplog.records  # arq logged no "error serializing result" traceback

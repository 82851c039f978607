"""Jobs are validated by the discriminated union and dispatched by kind (scheduler/jobs.py)."""

from __future__ import annotations

import json

import pytest

from scheduler.errors import InvalidRequest
from scheduler.jobs import CompletionJob, DetokenizeJob, JobKind, TokenizeJob, parse_job
from scheduler.queueing import queue_for


def test_a_job_round_trips_through_json_as_its_kind() -> None:
    job = CompletionJob(model="m", prompt="hi")
    payload = json.loads(json.dumps(job.model_dump(mode="json")))
    assert payload["kind"] == "completion"
    parsed = parse_job(payload, JobKind.COMPLETION)
    assert isinstance(parsed, CompletionJob) and parsed == job
    assert parsed.kind is JobKind.COMPLETION


def test_an_unknown_kind_is_an_error_not_a_detokenize() -> None:
    with pytest.raises(InvalidRequest, match="malformed"):
        parse_job({"kind": "embedding", "model": "m", "tokens": [1]}, JobKind.DETOKENIZE)
    with pytest.raises(InvalidRequest, match="malformed"):
        parse_job({"model": "m", "tokens": [1]}, JobKind.DETOKENIZE)


def test_a_job_on_the_wrong_function_is_an_error() -> None:
    payload = TokenizeJob(model="m", content="x").model_dump(mode="json")
    with pytest.raises(InvalidRequest, match="tokenize job reached the detokenize"):
        parse_job(payload, JobKind.DETOKENIZE)


def test_queues_by_kind() -> None:
    assert queue_for(TokenizeJob(model="m", content="x")) == queue_for(
        DetokenizeJob(model="m", tokens=[]))
    assert queue_for(CompletionJob(model="m", prompt="x")) != queue_for(
        TokenizeJob(model="m", content="x"))

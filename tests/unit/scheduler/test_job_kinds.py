"""Jobs are validated by the discriminated union and dispatched by kind
(scheduler/contract/jobs.py)."""

from __future__ import annotations

import json
from typing import get_args

import pytest

from scheduler.contract import keys
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import (
    CompletionJob,
    DetokenizeJob,
    Job,
    JobKind,
    SlotActionJob,
    TokenizeJob,
    parse_job,
)
from scheduler.contract.kinds import KINDS, Lane, kinds_of, movable, queue_for
from scheduler.contract.results import Result


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


def test_the_kind_table_has_every_kind_and_matches_the_unions() -> None:
    assert set(KINDS) == set(JobKind)
    jobs = {arg for arg in get_args(get_args(Job)[0])}
    results = {arg for arg in get_args(get_args(Result)[0])}
    assert {spec.job for spec in KINDS.values()} == jobs
    assert {spec.result for spec in KINDS.values()} == results
    for kind, spec in KINDS.items():
        assert spec.job.model_fields["kind"].default is kind
        assert spec.home in spec.lanes
        assert spec.background is None or spec.background in spec.lanes


def test_queues_and_movability_come_from_the_table() -> None:
    assert queue_for(CompletionJob(model="m", prompt="x")) == keys.slot_queue("m")
    assert queue_for(CompletionJob(model="m", prompt="x", worker_id="w", id_slot=1)) == \
        keys.worker_queue("m", "w")
    assert queue_for(CompletionJob(model="m", prompt="x", background=True)) == \
        keys.batch_queue("m")
    assert queue_for(SlotActionJob(model="m", worker_id="w", id_slot=0, action="erase")) == \
        keys.worker_queue("m", "w")
    assert queue_for(TokenizeJob(model="m", content="x")) == keys.utility_queue("m")
    assert movable("completion", None) and not movable("completion", "w", id_slot=0)
    assert movable("completion", "w")  # an n_cmpl group's: placed, not pinned to a slot
    assert not movable("decision", "w")
    assert not movable("slot_action", None) and not movable("tokenize", None)
    assert not movable("no-such-kind", None)
    assert kinds_of(Lane.SLOT) == [JobKind.COMPLETION, JobKind.DECISION]
    assert kinds_of(Lane.WORKER) == [JobKind.COMPLETION, JobKind.DECISION, JobKind.SLOT_ACTION]
    assert kinds_of(Lane.BATCH) == [JobKind.COMPLETION]
    assert kinds_of(Lane.UTILITY) == [JobKind.TOKENIZE, JobKind.DETOKENIZE]
    assert kinds_of(Lane.EMBED) == kinds_of(Lane.EMBED_BACKGROUND) == [JobKind.EMBEDDING,
                                                                         JobKind.RERANK]

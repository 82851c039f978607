"""A migrated completion's continuation, read from its event log (scheduler/migration.py)."""

from __future__ import annotations

from scheduler.contract.errors import Unavailable
from scheduler.contract.jobs import DEFAULT_SEED
from scheduler.contract.results import (
    Candidate,
    ErrorEvent,
    EventEnvelope,
    PromptProgress,
    StartedEvent,
    Timings,
    TokenEvent,
    TokenProbs,
)
from scheduler.migration import continuation_from, continuation_seed


def _log(*events: object) -> list[EventEnvelope]:
    return [EventEnvelope.model_validate({"job_id": "j", "seq": i, "event": e})
            for i, e in enumerate(events)]


def _token(token: int, content: str, **fields: object) -> TokenEvent:
    return TokenEvent(content=content, tokens=[token], **fields)  # type: ignore[arg-type]


def test_the_tokens_and_text_the_client_got_in_order() -> None:
    probs = TokenProbs(id=7, token="b", bytes=[98], p=0.5,
                       top=[Candidate(id=7, token="b", bytes=[98], p=0.5)])
    progress = TokenEvent(content="", tokens=[], progress=PromptProgress(
        total=3, cache=0, processed=3, time_ms=1))
    resumed = continuation_from(_log(
        StartedEvent(), progress, _token(5, "a"), _token(6, ""),  # "" : a stop's start held
        _token(7, "b", probs=[probs], timings=Timings(predicted_ms=12.5))), died_at_ms=99)
    assert resumed is not None
    assert resumed.tokens == [5, 6, 7]
    assert resumed.content == "ab"
    assert resumed.probs == [probs]
    assert resumed.predicted_ms == 12.5
    assert resumed.next_seq == 5  # the log's, not a count of tokens
    assert resumed.died_at_ms == 99


def test_no_continuation_from_a_trimmed_or_an_ended_log() -> None:
    whole = _log(StartedEvent(), _token(5, "a"), _token(6, "b"))
    assert continuation_from(whole[1:]) is None  # its first events are gone
    assert continuation_from([]) is None
    error = ErrorEvent(error=Unavailable("x").to_info())
    assert continuation_from(_log(StartedEvent(), _token(5, "a"), error)) is None


def test_a_job_that_sent_only_progress_starts_over() -> None:
    progress = TokenEvent(content="", tokens=[], progress=PromptProgress(
        total=3, cache=0, processed=1, time_ms=1))
    resumed = continuation_from(_log(StartedEvent(), progress))
    assert resumed is not None
    assert resumed.tokens == [] and resumed.content == "" and resumed.next_seq == 2


def test_the_seed_of_a_continuation() -> None:
    assert continuation_seed(DEFAULT_SEED, 4) == DEFAULT_SEED  # random stays random
    assert continuation_seed(42, 4) == continuation_seed(42, 4)
    assert continuation_seed(42, 4) != continuation_seed(42, 5)
    assert continuation_seed(42, 4) != continuation_seed(43, 4)
    assert 0 <= continuation_seed(42, 4) < DEFAULT_SEED

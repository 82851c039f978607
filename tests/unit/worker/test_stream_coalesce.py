"""--stream-interval (worker/wires/coalesce.py): a job's consecutive token events in one flush
become one event with all their tokens, text and probabilities, its last timings and
position; other jobs' events between them do not break the run, the job's other events do;
only later tokens of running jobs may wait for a flush."""

from __future__ import annotations

from scheduler.contract.results import (
    ErrorEvent,
    PromptProgress,
    StartedEvent,
    Timings,
    TokenEvent,
)
from worker.engine.runs import JobEvent
from worker.wires.coalesce import can_wait, coalesce


def token(text: str, n: int, token_id: int = 7) -> TokenEvent:
    return TokenEvent(content=text, tokens=[token_id], n_decoded=n,
                      timings=Timings(predicted_n=n))


def test_a_jobs_tokens_merge_across_other_jobs() -> None:
    events: list[JobEvent] = [("a", token(" x", 2, 1)), ("b", token(" y", 5)),
                              ("a", token(" z", 3, 2)), ("b", token(" w", 6))]
    out = coalesce(events)
    assert [j for j, _ in out] == ["a", "b"]
    a = out[0][1]
    assert isinstance(a, TokenEvent)
    assert (a.content, a.tokens, a.n_decoded) == (" x z", [1, 2], 3)
    assert a.timings is not None and a.timings.predicted_n == 3


def test_other_events_break_the_run_and_keep_their_order() -> None:
    progress = TokenEvent(content="", tokens=[], progress=PromptProgress(
        total=1, cache=0, processed=1, time_ms=1))
    error = ErrorEvent.model_validate({"error": {"code": 500, "message": "x",
                                                 "type": "server_error"}})
    events: list[JobEvent] = [("a", StartedEvent()), ("a", progress), ("a", token(" 1", 1)),
                              ("a", token(" 2", 2)), ("a", error), ("a", token(" 3", 3))]
    out = coalesce(events)
    kinds = [(e.kind, getattr(e, "content", None)) for _, e in out]
    assert kinds == [("started", None), ("token", ""), ("token", " 1 2"), ("error", None),
                     ("token", " 3")]


def test_only_later_tokens_wait() -> None:
    assert can_wait([("a", token(" 2", 2))])
    assert not can_wait([("a", token(" 1", 1))])  # a first token: the TTFT waits for nothing
    assert not can_wait([("a", token(" 2", 2)), ("b", StartedEvent())])

"""Events on a job's channel survive JSON with their discriminated types."""

from __future__ import annotations

from scheduler.contract.errors import ErrorInfo
from scheduler.contract.results import (
    ENVELOPE,
    DetokenizeResult,
    ErrorEvent,
    EventEnvelope,
    FinalEvent,
    Timings,
    TokenEvent,
    TokenizeResult,
    TokenPiece,
)


def round_trip(envelope: EventEnvelope) -> EventEnvelope:
    return ENVELOPE.validate_json(envelope.model_dump_json())


def test_token_event_round_trip() -> None:
    sent = EventEnvelope(job_id="j1", seq=0, event=TokenEvent(content="hé", tokens=[5, 6]))
    back = round_trip(sent)
    assert back == sent
    assert isinstance(back.event, TokenEvent)
    assert back.event.timings is None


def test_token_event_with_timings_round_trip() -> None:
    timings = Timings(prompt_n=3, predicted_n=1, predicted_ms=2.5)
    sent = EventEnvelope(job_id="j", seq=4, event=TokenEvent(content="", tokens=[1],
                                                             timings=timings))
    back = round_trip(sent)
    assert isinstance(back.event, TokenEvent)
    assert back.event.timings == timings
    assert back.seq == 4


def test_final_tokenize_result_round_trip() -> None:
    result = TokenizeResult(tokens=[1, 2, 3])
    back = round_trip(EventEnvelope(job_id="j2", seq=3, event=FinalEvent(result=result)))
    assert isinstance(back.event, FinalEvent)
    assert isinstance(back.event.result, TokenizeResult)
    assert back.event.result.tokens == [1, 2, 3]


def test_final_tokenize_result_with_pieces_round_trip() -> None:
    pieces = [TokenPiece(id=1, piece="a"), TokenPiece(id=2, piece=[0xE2, 0x82])]
    back = round_trip(EventEnvelope(job_id="j", seq=1,
                                    event=FinalEvent(result=TokenizeResult(tokens=pieces))))
    assert isinstance(back.event, FinalEvent)
    assert isinstance(back.event.result, TokenizeResult)
    assert back.event.result.tokens == pieces


def test_final_detokenize_result_round_trip() -> None:
    back = round_trip(EventEnvelope(job_id="j", seq=0,
                                    event=FinalEvent(result=DetokenizeResult(content="x"))))
    assert isinstance(back.event, FinalEvent)
    assert isinstance(back.event.result, DetokenizeResult)
    assert back.event.result.content == "x"


def test_error_event_round_trip() -> None:
    error = ErrorInfo(code=400, message="too long", type="exceed_context_size_error",
                      extra={"n_prompt_tokens": 10, "n_ctx": 8})
    sent = EventEnvelope(job_id="j3", seq=7, event=ErrorEvent(error=error))
    back = round_trip(sent)
    assert back == sent
    assert isinstance(back.event, ErrorEvent)
    assert back.event.error == error


def test_kind_tags_are_on_the_wire() -> None:
    raw = EventEnvelope(job_id="j", seq=0,
                        event=FinalEvent(result=TokenizeResult(tokens=[]))).model_dump()
    assert raw["event"]["kind"] == "final"
    assert raw["event"]["result"]["result_kind"] == "tokenize"

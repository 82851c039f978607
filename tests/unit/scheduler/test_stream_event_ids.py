"""SSE event ids of resumable streams, and how events travel on pub/sub."""

from __future__ import annotations

import pytest

from scheduler.contract import keys
from scheduler.contract.errors import NotFound
from scheduler.contract.results import EventEnvelope, TokenEvent
from scheduler.streams import EventId


def test_event_id_round_trip() -> None:
    event_id = EventId(record_id="abc123", counts=[3, 0, 1])
    assert event_id.text() == "abc123-3.0.1"
    assert EventId.parse(event_id.text()) == event_id


@pytest.mark.parametrize("text", ["", "abc", "abc-", "abc-1.x", "-1.2", "abc--1"])
def test_bad_event_ids_are_404(text: str) -> None:
    with pytest.raises(NotFound):
        EventId.parse(text)


def test_big_events_go_by_pointer() -> None:
    from worker.wires.publisher import announcement

    small = EventEnvelope(job_id="j", seq=4, event=TokenEvent(content="x", tokens=[1]))
    data = small.model_dump_json().encode()
    assert announcement(data, 4) == b"E" + data
    big = EventEnvelope(job_id="j", seq=7, event=TokenEvent(
        content="x" * (keys.EVENT_INLINE_MAX_BYTES + 1), tokens=[1]))
    assert announcement(big.model_dump_json().encode(), 7) == b"R7"

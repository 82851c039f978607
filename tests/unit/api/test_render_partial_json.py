"""partial_json: a streamed token in llama-server's native shape."""

from __future__ import annotations

from api.endpoints.native.render import partial_json
from scheduler.contract.results import Timings, TokenEvent


def test_keys_are_content_tokens_stop() -> None:
    data = partial_json(TokenEvent(content="hi", tokens=[7]))
    assert data == {"content": "hi", "tokens": [7], "stop": False}
    assert list(data) == ["content", "tokens", "stop"]


def test_index_only_when_given() -> None:
    assert set(partial_json(TokenEvent(content="", tokens=[]), index=0)) == {
        "content", "tokens", "stop", "index",
    }
    assert partial_json(TokenEvent(content="a", tokens=[1]), index=2)["index"] == 2
    assert "index" not in partial_json(TokenEvent(content="a", tokens=[1]))


def test_timings_only_when_set() -> None:
    timings = Timings(prompt_n=2, predicted_n=1, predicted_ms=3.0)
    data = partial_json(TokenEvent(content="a", tokens=[1], timings=timings))
    assert set(data) == {"content", "tokens", "stop", "timings"}
    assert data["timings"] == timings.model_dump()
    assert data["timings"]["predicted_n"] == 1


def test_index_and_timings_together() -> None:
    data = partial_json(TokenEvent(content="a", tokens=[1], timings=Timings()), index=1)
    assert set(data) == {"content", "tokens", "stop", "index", "timings"}
    assert data["stop"] is False

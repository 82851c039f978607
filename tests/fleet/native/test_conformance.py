"""Behaviour that clients of llama-server can tell apart (issue 14), on the session's fleet:
timings, prompt progress, slots after a response, response_format, media without a projector,
empty Anthropic messages, Responses streams with progress and timings."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.fleet.sse import stream_completion


def post(api: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api}{path}", json=body, timeout=120)


def test_generation_rate_leaves_out_the_first_token(api: str) -> None:
    # The first token comes from the prompt's last batch: it costs no decode step.
    one = post(api, "/completion", {"prompt": "I believe", "n_predict": 1}).json()["timings"]
    assert one["predicted_n"] == 1
    assert one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0
    assert one["prompt_ms"] > 0 and one["prompt_per_token_ms"] > 0
    many = post(api, "/completion", {"prompt": "I believe", "n_predict": 16,
                                     "ignore_eos": True}).json()["timings"]
    assert many["predicted_n"] == 16
    assert many["predicted_per_second"] == pytest.approx(1e3 / many["predicted_ms"] * 15)
    assert many["predicted_per_token_ms"] == pytest.approx(many["predicted_ms"] / 15)


def test_prompt_progress_carries_timings(api: str) -> None:
    events = stream_completion(api, {"prompt": "word " * 40, "n_predict": 2,
                                     "return_progress": True, "timings_per_token": True,
                                     "cache_prompt": False})
    progress = [e for e in events if "prompt_progress" in e]
    assert len(progress) >= 2
    first, last = progress[0]["prompt_progress"], progress[-1]["prompt_progress"]
    assert first["processed"] == first["cache"] == 0  # the 0 % event, as the prompt starts
    assert last["processed"] == last["total"] > 40
    assert all("timings" in e for e in progress)
    assert progress[-1]["timings"]["prompt_n"] == last["total"]
    assert progress[-1]["timings"]["predicted_n"] == 0


def test_prompt_progress_chunks_are_llama_servers(api: str) -> None:
    """Field by field as the vendored server's: time_ms is whole milliseconds; in a chat
    stream each progress chunk is a role delta, and the first token still gets its own role
    chunk after them."""
    native = stream_completion(api, {"prompt": "word " * 40, "n_predict": 2,
                                     "return_progress": True, "cache_prompt": False})
    progress = [e["prompt_progress"] for e in native if "prompt_progress" in e]
    assert progress and all(set(p) == {"total", "cache", "processed", "time_ms"}
                            and isinstance(p["time_ms"], int) for p in progress), progress
    with httpx.stream("POST", f"{api}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "word " * 40}], "max_tokens": 2,
            "stream": True, "return_progress": True, "cache_prompt": False}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]
    chunks = [c for c in chunks if c.get("choices")]
    role = {"role": "assistant", "content": None}
    n = sum(1 for c in chunks if "prompt_progress" in c)
    assert n >= 2 and all("prompt_progress" in c for c in chunks[:n])  # they come first
    assert all(c["choices"][0]["delta"] == role for c in chunks[:n])
    assert all(isinstance(c["prompt_progress"]["time_ms"], int) for c in chunks[:n])
    assert chunks[n]["choices"][0]["delta"] == role and "prompt_progress" not in chunks[n]
    assert "role" not in chunks[n + 1]["choices"][0]["delta"]


def test_slot_is_idle_when_the_response_arrives(api: str) -> None:
    for n_predict in (1, 4, 8):
        result = post(api, "/completion", {"prompt": "Hello there", "n_predict": n_predict})
        slots = httpx.get(f"{api}/slots", timeout=30).json()
        slot = next(s for s in slots if s["id"] == result.json()["id_slot"])
        assert slot["is_processing"] is False, slot
        assert slot["next_token"][0]["n_remain"] == -1
        assert slot["next_token"][0]["n_decoded"] == 0
        assert slot["next_token"][0]["has_next_token"] is False


@pytest.mark.parametrize("response_format", [
    {"type": "json_object", "schema": {"type": 123}},
    {"type": "json_object", "schema": {"type": "hiccup"}},
    {"type": "json_schema", "json_schema": {"schema": {"type": "hiccup"}}},
    {"type": "json_object", "schema": 123},  # not an object: llama-server's schema conversion
])
def test_invalid_response_format_schema_is_400(api: str, response_format: Any) -> None:
    response = post(api, "/v1/chat/completions", {
        "max_tokens": 4, "messages": [{"role": "user", "content": "Write an example"}],
        "response_format": response_format})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("response_format,pattern", [
    ({"type": "json_object", "schema": {"const": "42"}}, '"42"'),
    ({"type": "json_schema", "json_schema": {"schema": {"const": "foooooo"}}}, '"foooooo"'),
])
def test_valid_response_format_constrains_the_output(api: str, response_format: Any,
                                                     pattern: str) -> None:
    response = post(api, "/v1/chat/completions", {
        "max_tokens": 10, "messages": [{"role": "user", "content": "Write an example"}],
        "response_format": response_format})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == pattern


MMPROJ = "image input is not supported - hint: if this is unexpected, you may need to provide " \
         "the mmproj"


def test_chat_image_without_projector_is_500(api: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    response = post(api, "/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]})
    assert response.status_code == 500, response.text
    assert response.json() == {"error": {"code": 500, "message": MMPROJ,
                                         "type": "server_error"}}


@pytest.mark.parametrize("source", [
    {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    {"type": "url", "url": "https://example.com/a.png"},
])
def test_anthropic_image_without_projector_is_500(api: str, source: dict[str, str]) -> None:
    response = post(api, "/v1/messages", {"model": "gemma", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "image", "source": source},
                                     {"type": "text", "text": "What is this?"}]}]})
    assert response.status_code == 500, response.text
    assert response.json()["error"]["message"] == MMPROJ


def test_anthropic_empty_messages_is_answered(api: str) -> None:
    response = post(api, "/v1/messages", {"model": "gemma", "max_tokens": 8, "messages": []})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["type"] == "message" and body["role"] == "assistant"
    assert body["usage"]["output_tokens"] >= 1


def _responses_events(api: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    events = []
    with httpx.stream("POST", f"{api}/v1/responses", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        name = ""
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_responses_stream_carries_progress_and_timings(api: str) -> None:
    events = _responses_events(api, {
        "input": "Say hello. " * 10, "max_output_tokens": 6, "timings_per_token": True,
        "return_progress": True, "cache_prompt": False})
    in_progress = [data for name, data in events if name == "response.in_progress"]
    assert len(in_progress) >= 2  # the first, and one per prompt batch
    with_progress = [data["prompt_progress"] for data in in_progress
                     if "prompt_progress" in data]
    assert with_progress, in_progress
    assert set(with_progress[-1]) >= {"total", "cache", "processed"}
    assert with_progress[-1]["processed"] == with_progress[-1]["total"]
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert deltas and all("timings" in data for data in deltas)
    assert deltas[-1]["timings"]["predicted_n"] >= 1
    assert events[-1][0] == "response.completed"

"""/v1/responses (converted to a chat completion) through the real fleet, with the official
`openai` SDK and raw SSE checks of the Responses event sequence."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

GREEDY: dict[str, Any] = {"temperature": 0.0}


@pytest.fixture(scope="module")
def client(api: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=api + "/v1", api_key="x", max_retries=0, timeout=120)


def named_events(api: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a Responses stream; every event must be named."""
    events = []
    name = None
    with httpx.stream("POST", f"{api}/v1/responses", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line or line.startswith((":", "id: ")):
                continue
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
                continue
            assert line.startswith("data: ") and name, line
            events.append((name, json.loads(line.removeprefix("data: "))))
            name = None
    return events


def test_sdk_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model="gpt-x", instructions="Be terse.",
                                       input="Say hello.", max_output_tokens=4, **GREEDY)
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "gemma"
    (item,) = response.output
    assert item.type == "message" and item.role == "assistant"
    assert isinstance(response.output_text, str) and response.output_text
    usage = response.usage
    assert usage is not None and usage.output_tokens == 4
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details is not None


def test_input_items_and_alias(api: str) -> None:
    body = {"input": [
        {"role": "system", "content": "Be terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "Again."},
    ], "max_output_tokens": 2}
    for path in ("/v1/responses", "/responses"):
        response = httpx.post(api + path, json=body, timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["output_tokens"] == 2


def test_sdk_stream_matches_non_stream(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": "m", "input": "List three colors.",
                            "max_output_tokens": 8, **GREEDY}
    whole = client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == whole.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_stream_event_sequence(api: str) -> None:
    events = named_events(api, {"input": "Say hello.", "max_output_tokens": 3, **GREEDY})
    names = [name for name, _ in events]
    for name, data in events:
        assert data["type"] == name
    assert names[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert names[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(names[4:-4]) == {"response.output_text.delta"}
    created = events[0][1]["response"]
    completed = events[-1][1]["response"]
    assert created["status"] == "in_progress" and completed["status"] == "completed"
    assert created["id"] == completed["id"]
    item_id = events[2][1]["item"]["id"]
    assert all(d["item_id"] == item_id for n, d in events if n == "response.output_text.delta")
    text = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert completed["output"][0]["content"][0]["text"] == text
    assert completed["usage"]["output_tokens"] == 3
    assert "timings" in events[-1][1]


def test_function_call(client: openai.OpenAI) -> None:
    tool: Any = {"type": "function", "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                           "required": ["city"]}}
    response = client.responses.create(
        model="m", input="Weather in Paris?", tools=[tool],
        tool_choice="required", max_output_tokens=40, **GREEDY)
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert call.id is not None and call.id.startswith("fc_")
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")


def test_function_call_output_in_history(api: str) -> None:
    body = {"input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
    ], "tools": [{"type": "function", "name": "get_weather",
                  "parameters": {"type": "object", "properties": {}}}], "max_output_tokens": 2}
    response = httpx.post(f"{api}/v1/responses", json=body, timeout=60)
    assert response.status_code == 200, response.text


def test_input_tokens(api: str) -> None:
    for path in ("/v1/responses/input_tokens", "/responses/input_tokens"):
        body = httpx.post(api + path, json={"input": "Say hello."}, timeout=60).json()
        assert body["object"] == "response.input_tokens"
        chat = httpx.post(f"{api}/v1/chat/completions/input_tokens", timeout=60,
                          json={"messages": [{"role": "user", "content": "Say hello."}]}).json()
        assert body["input_tokens"] == chat["input_tokens"] > 3


@pytest.mark.parametrize("body", [
    {"model": "m"},
    {"input": "x", "previous_response_id": "resp_1"},
    {"input": 42},
    {"input": [{"type": "mystery"}]},
    {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
    {"input": "x", "max_output_tokens": -4},
    {"input": "x", "tool_choice": "sometimes"},
])
def test_bad_requests_are_400(api: str, body: dict[str, Any]) -> None:
    response = httpx.post(f"{api}/v1/responses", json=body, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_input_image_without_projector_is_500(api: str) -> None:
    body = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}
    response = httpx.post(f"{api}/v1/responses", json=body, timeout=30)
    assert response.status_code == 500, response.text
    assert response.json()["error"]["type"] == "server_error"
    assert response.json()["error"]["message"].startswith("image input is not supported - hint")

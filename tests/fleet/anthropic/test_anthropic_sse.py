"""Raw HTTP checks of /v1/messages: the SSE event sequence, errors in the spec's shape,
multimodal input, and x-api-key / anthropic-version headers."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

USER = [{"role": "user", "content": "Tell me a story."}]
BODY: dict[str, Any] = {"model": "gemma", "messages": USER, "max_tokens": 6, "temperature": 0}
HEADERS = {"anthropic-version": "2023-06-01"}


def read_events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs; every event must have both lines, in that order."""
    events: list[tuple[str, dict[str, Any]]] = []
    name = None
    for line in response.iter_lines():
        if not line or line.startswith((":", "id: ")):
            continue
        if line.startswith("event: "):
            assert name is None, f"two event lines in a row: {line!r}"
            name = line.removeprefix("event: ")
            continue
        assert line.startswith("data: ") and name is not None, f"unexpected line: {line!r}"
        events.append((name, json.loads(line.removeprefix("data: "))))
        name = None
    assert name is None
    return events


def stream_events(api: str, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    with httpx.stream("POST", f"{api}/v1/messages", json={**body, "stream": True},
                      headers=HEADERS, timeout=300) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_events(response)


def test_event_sequence(api: str) -> None:
    events = stream_events(api, BODY)
    for name, data in events:
        assert data["type"] == name
    names = [name for name, _ in events]
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    middle = names[1:-2]
    if middle:  # one text block: start, deltas, stop
        assert middle[0] == "content_block_start" and middle[-1] == "content_block_stop"
        assert set(middle[1:-1]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["id"].startswith("msg_") and start["model"] == "gemma"
    assert start["role"] == "assistant" and start["content"] == []
    assert start["stop_reason"] is None and start["stop_sequence"] is None
    usage = start["usage"]
    assert usage["output_tokens"] == 0 and usage["input_tokens"] > 0
    assert set(usage) == {"input_tokens", "output_tokens", "cache_read_input_tokens"}
    if middle:
        assert events[1][1] == {"type": "content_block_start", "index": 0,
                                "content_block": {"type": "text", "text": ""}}
        deltas = [data for name, data in events if name == "content_block_delta"]
        assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in deltas)
        assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    final = events[-2][1]
    assert final["delta"]["stop_reason"] in ("max_tokens", "end_turn")
    assert final["delta"]["stop_sequence"] is None
    assert 0 < final["usage"]["output_tokens"] <= 6
    assert events[-1][1] == {"type": "message_stop"}


def test_stream_text_equals_message_text(api: str) -> None:
    whole = httpx.post(f"{api}/v1/messages", json=BODY, headers=HEADERS, timeout=120)
    assert whole.status_code == 200, whole.text
    message = whole.json()
    assert list(message) == ["id", "type", "role", "content", "model", "stop_reason",
                             "stop_sequence", "usage"]
    text = "".join(b["text"] for b in message["content"] if b["type"] == "text")
    events = stream_events(api, BODY)
    streamed = "".join(data["delta"]["text"] for name, data in events
                       if name == "content_block_delta")
    assert streamed == text
    assert events[-2][1]["usage"]["output_tokens"] == message["usage"]["output_tokens"]


def error_of(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"code", "message", "type"}
    assert error["code"] == status and error["type"] == kind
    return str(error["message"])


@pytest.mark.parametrize("body", [
    {"model": "gemma"},  # no messages
    {"model": "gemma", "messages": [{"role": "tool", "content": "x"}]},
    {"model": "gemma", "messages": [{"role": "user"}]},
    {"model": "gemma", "messages": USER, "tools": [{"name": "f"}]},
    {"model": "gemma", "messages": USER,
     "tools": [{"name": "f", "input_schema": {"type": "array"}}]},
    {"model": "gemma", "messages": USER, "tool_choice": {"type": "sometimes"}},
    {"model": "gemma", "messages": USER, "max_tokens": "many"},
])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_requests(api: str, body: dict[str, Any], path: str, stream: bool) -> None:
    response = httpx.post(f"{api}{path}", json={**body, "stream": stream}, headers=HEADERS)
    error_of(response, 400, "invalid_request_error")


def test_malformed_json(api: str) -> None:
    response = httpx.post(f"{api}/v1/messages", content=b"{not json",
                          headers={**HEADERS, "content-type": "application/json"})
    error_of(response, 400, "invalid_request_error")


@pytest.mark.parametrize("stream", [False, True])
def test_image_needs_a_projector(api: str, stream: bool) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "iVBORw0KGgo="}}
    body = {**BODY, "stream": stream,
            "messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]}
    response = httpx.post(f"{api}/v1/messages", json=body, headers=HEADERS)
    assert error_of(response, 500, "server_error") == (
        "image input is not supported - hint: if this is unexpected, you may need to provide "
        "the mmproj")


def test_sdk_errors(api: str) -> None:
    client = anthropic.Anthropic(base_url=api, api_key="x", max_retries=0)
    create: Any = client.messages.create
    with pytest.raises(anthropic.BadRequestError) as bad:
        create(model="gemma", max_tokens=5, messages=[{"role": "robot", "content": "x"}])
    assert bad.value.status_code == 400
    assert isinstance(bad.value.body, dict)
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    with pytest.raises(anthropic.APIStatusError) as unsupported:
        create(model="gemma", max_tokens=5, messages=[{"role": "user", "content": [image]}])
    assert unsupported.value.status_code == 500  # llama-server's answer without an mmproj


def test_x_api_key(keyed_api: str) -> None:
    url = keyed_api  # the session's worker behind a pod with --api-key sekrit
    good = anthropic.Anthropic(base_url=url, api_key="sekrit", max_retries=0, timeout=120)
    create: Any = good.messages.create
    assert create(model="gemma", max_tokens=3, messages=USER).type == "message"
    count: Any = good.messages.count_tokens
    assert count(model="gemma", messages=USER).input_tokens > 0
    bad = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0)
    bad_create: Any = bad.messages.create
    with pytest.raises(anthropic.AuthenticationError) as denied:
        bad_create(model="gemma", max_tokens=3, messages=USER)
    assert denied.value.body == {"error": {"code": 401, "message": "Invalid API Key",
                                           "type": "authentication_error"}}
    raw = httpx.post(f"{url}/v1/messages", json=BODY,
                     headers={**HEADERS, "x-api-key": "sekrit"}, timeout=120)
    assert raw.status_code == 200
    assert httpx.post(f"{url}/v1/messages", json=BODY, headers=HEADERS).status_code == 401


def test_tool_use_events(api: str) -> None:
    tools = [{"name": "get_weather", "input_schema": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"]}}]
    body = {**BODY, "max_tokens": 200, "tools": tools,
            "tool_choice": {"type": "tool", "name": "get_weather",
                            "disable_parallel_tool_use": True}}
    events = stream_events(api, body)
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"], events
    block = starts[0]["content_block"]
    assert block["name"] == "get_weather" and block["id"] and block["input"] == {}
    index = starts[0]["index"]
    deltas = [data for name, data in events if name == "content_block_delta"]
    assert deltas and all(d["index"] == index for d in deltas)
    assert {d["delta"]["type"] for d in deltas} == {"input_json_delta"}
    arguments = json.loads("".join(d["delta"]["partial_json"] for d in deltas))
    assert arguments in ({"city": "Paris"}, {"city": "Rome"})
    names = [name for name, _ in events]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_thinking_events(api: str) -> None:
    body = {**BODY, "messages": [*USER, {"role": "assistant", "content": "<think>"}]}
    events = stream_events(api, body)
    assert [name for name, _ in events][:2] == ["message_start", "content_block_start"]
    assert events[1][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "thinking", "thinking": ""}}
    deltas = [data["delta"] for name, data in events if name == "content_block_delta"]
    assert {d["type"] for d in deltas[:-1]} == {"thinking_delta"}
    assert deltas[-1] == {"type": "signature_delta", "signature": ""}
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    whole = httpx.post(f"{api}/v1/messages", json=body, timeout=120).json()
    assert whole["content"] == [{"type": "thinking", "signature": "",
                                 "thinking": "".join(d.get("thinking", "") for d in deltas)}]

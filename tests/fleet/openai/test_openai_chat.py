"""/v1/chat/completions through the real fleet (Gemma 3 270M, chatml), with the official
`openai` SDK and raw HTTP SSE checks."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.fleet.openai.test_openai_completions import sse_payloads

GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 42}
HELLO: Any = [{"role": "user", "content": "Say hello."}]
WEATHER_TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                   "required": ["city"]}}}
"""Tools with enum arguments keep constrained answers short (grammars are slow on CPU)."""


@pytest.fixture(scope="module")
def client(api: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=api + "/v1", api_key="x", max_retries=0, timeout=120)


def chat(api: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(api + path, json=body, timeout=120)


def test_sdk_chat(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="gpt-x", messages=HELLO,
                                                max_tokens=5, **GREEDY)
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "gemma" and completion.system_fingerprint
    (choice,) = completion.choices
    assert choice.index == 0 and choice.finish_reason in ("length", "stop")
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.message.tool_calls is None
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None


def test_raw_chat_has_timings_and_alias(api: str) -> None:
    for path in ("/v1/chat/completions", "/chat/completions"):
        body = chat(api, {"messages": HELLO, "max_tokens": 2}, path).json()
        assert body["object"] == "chat.completion"
        assert body["timings"]["predicted_n"] == body["usage"]["completion_tokens"]
        assert body["choices"][0]["message"]["role"] == "assistant"


def test_sdk_stream_matches_non_stream(client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": "m", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List three colors."}], "max_tokens": 12, **GREEDY}
    whole = client.chat.completions.create(**args).choices[0]
    chunks = list(client.chat.completions.create(**args, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.message.content
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    assert len({c.id for c in chunks}) == 1


def test_stream_event_sequence(api: str) -> None:
    payloads = sse_payloads(api, "/v1/chat/completions",
                            {"messages": HELLO, "max_tokens": 4, **GREEDY})
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    final = chunks[-1]
    assert final["choices"][0]["delta"] == {} and final["choices"][0]["finish_reason"]
    assert "timings" in final and "usage" not in final
    for chunk in chunks[1:-1]:
        assert chunk["choices"][0]["finish_reason"] is None
        assert set(chunk["choices"][0]["delta"]) <= {"content", "reasoning_content",
                                                     "tool_calls"}


def test_stream_include_usage(api: str, client: openai.OpenAI) -> None:
    payloads = sse_payloads(api, "/v1/chat/completions", {
        "messages": HELLO, "max_tokens": 3, "stream_options": {"include_usage": True}})
    *chunks, usage_chunk, done = payloads
    assert done == "[DONE]"
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = list(client.chat.completions.create(
        model="m", messages=HELLO, max_tokens=3, stream=True,
        stream_options={"include_usage": True}))
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 3


def test_n_choices(client: openai.OpenAI, api: str) -> None:
    completion = client.chat.completions.create(model="m", messages=HELLO, n=2,
                                                max_tokens=3, **GREEDY)
    assert [c.index for c in completion.choices] == [0, 1]
    assert completion.choices[0].message.content == completion.choices[1].message.content
    payloads = sse_payloads(api, "/v1/chat/completions",
                            {"messages": HELLO, "max_tokens": 3, "n": 2, **GREEDY})
    chunks = payloads[:-1]
    roles = [c["choices"][0]["index"] for c in chunks
             if c["choices"][0]["delta"].get("role") == "assistant"]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(roles) == sorted(finishes) == [0, 1]


def test_stop_and_max_completion_tokens(client: openai.OpenAI) -> None:
    base: dict[str, Any] = {"model": "m", "messages": [
        {"role": "user", "content": "Count: one, two, three, four, five,"}], **GREEDY}
    free = client.chat.completions.create(**base, max_completion_tokens=16).choices[0]
    assert free.message.content is not None
    assert client.chat.completions.create(
        **base, max_completion_tokens=2).usage.completion_tokens == 2
    word = free.message.content.split()[1] if len(free.message.content.split()) > 1 else None
    if word:
        stopped = client.chat.completions.create(**base, max_tokens=16, stop=[word]).choices[0]
        assert stopped.finish_reason == "stop"
        assert stopped.message.content == free.message.content[: free.message.content.index(word)]


def test_response_format_json_object(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Give me a JSON object."}],
        max_tokens=6, response_format={"type": "json_object"}, **GREEDY)
    choice = completion.choices[0]
    content = choice.message.content or ""
    assert content.lstrip().startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}},
    {"type": "json_schema", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
    {"type": "json_object", "schema": {"type": "boolean"}},
])
def test_response_format_schemas(api: str, response_format: dict[str, Any]) -> None:
    body = chat(api, {"messages": HELLO, "max_tokens": 30, "response_format": response_format,
                      **GREEDY}).json()
    content = body["choices"][0]["message"]["content"]
    assert body["choices"][0]["finish_reason"] == "stop", content
    value = json.loads(content)
    if response_format.get("schema", {}).get("type") == "boolean":
        assert isinstance(value, bool)
    else:
        assert isinstance(value["ok"], bool)


def test_logprobs(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model="m", messages=HELLO, max_tokens=3,
                                                logprobs=True, top_logprobs=2, **GREEDY)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 3
    for token in logprobs.content:
        assert token.logprob <= 0 and len(token.top_logprobs) == 2
        assert token.bytes is not None


def test_stream_logprobs(api: str) -> None:
    payloads = sse_payloads(api, "/v1/chat/completions", {
        "messages": HELLO, "max_tokens": 3, "logprobs": True, "top_logprobs": 1, **GREEDY})
    with_probs = [c for c in payloads[:-1] if c["choices"] and c["choices"][0].get("logprobs")]
    assert with_probs
    token = with_probs[0]["choices"][0]["logprobs"]["content"][0]
    assert set(token) >= {"token", "logprob", "bytes", "top_logprobs"}


def test_required_tool_call(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice="required", max_tokens=40, **GREEDY)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")


def test_named_tool_call_streams_deltas(api: str) -> None:
    other = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["JST", "UTC"]}}, "required": ["zone"]}}}
    body = {"messages": [{"role": "user", "content": "Time in Tokyo?"}],
            "tools": [WEATHER_TOOL, other],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "max_tokens": 40, **GREEDY}
    payloads = sse_payloads(api, "/v1/chat/completions", body)
    chunks = payloads[:-1]
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls and calls[0]["function"]["name"] == "get_time" and calls[0]["id"]
    assert calls[0]["type"] == "function" and calls[0]["index"] == 0
    arguments = "".join(call.get("function", {}).get("arguments", "") for call in calls)
    assert json.loads(arguments)["zone"] in ("JST", "UTC")
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_history_is_accepted(client: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21C"},
    ]
    completion = client.chat.completions.create(model="m", messages=messages,
                                                tools=[WEATHER_TOOL], max_tokens=4)
    assert completion.choices[0].message.role == "assistant"


def test_reasoning_format_none_keeps_the_text(api: str) -> None:
    body = {"messages": HELLO, "max_tokens": 4, "reasoning_format": "none", **GREEDY}
    message = chat(api, body).json()["choices"][0]["message"]
    assert "reasoning_content" not in message


def test_prefill_continues_the_assistant_message(api: str) -> None:
    messages = [*HELLO, {"role": "assistant", "content": "Hello! My name is"}]
    body = chat(api, {"messages": messages, "max_tokens": 3, **GREEDY}).json()
    assert body["usage"]["completion_tokens"] <= 3


def test_input_tokens(api: str) -> None:
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        body = chat(api, {"messages": HELLO}, path).json()
        assert body["object"] == "response.input_tokens"
        real = chat(api, {"messages": HELLO, "max_tokens": 1, "cache_prompt": False}).json()
        assert body["input_tokens"] == real["usage"]["prompt_tokens"]


def test_control_unknown_id(api: str) -> None:
    response = chat(api, {"id": "chatcmpl-nope", "action": "reasoning_end"},
                    "/v1/chat/completions/control")
    assert response.status_code == 200
    assert response.json()["success"] is False and response.json()["message"]
    response = chat(api, {"id": "chatcmpl-nope", "reasoning_end": True},
                    "/v1/chat/completions/control")
    assert response.status_code == 200 and response.json()["success"] is False


@pytest.mark.parametrize("body", [{"action": "reasoning_end"}, {"id": "x", "action": "jump"},
                                  {"id": "x"}])
def test_control_bad_requests(api: str, body: dict[str, Any]) -> None:
    response = chat(api, body, "/v1/chat/completions/control")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


BAD_CHAT_BODIES = [
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"content": "hi"}]},
    {"messages": []},
    {"messages": "hi"},
    {},
    {"messages": HELLO, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}]},
    {"messages": HELLO, "tools": [{"type": "retrieval"}]},
    {"messages": HELLO, "tools": [WEATHER_TOOL], "tool_choice": "sometimes"},
    {"messages": HELLO, "tools": [WEATHER_TOOL],
     "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"messages": HELLO, "n": 0},
    {"messages": HELLO, "max_tokens": -2},
    {"messages": HELLO, "top_logprobs": 2},
    {"messages": HELLO, "reasoning_format": "loud"},
    {"messages": HELLO, "response_format": {"type": "xml"}},
    {"messages": HELLO, "grammar": "root ::= \"a\"", "json_schema": {"type": "object"}},
    {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": "yes"}},
]


@pytest.mark.parametrize("body", BAD_CHAT_BODIES)
def test_bad_chat_requests_are_400(api: str, body: dict[str, Any]) -> None:
    response = chat(api, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400
    assert error["message"]


def test_sdk_raises_bad_request(client: openai.OpenAI) -> None:
    wizard: Any = [{"role": "wizard", "content": "x"}]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=wizard)


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
])
def test_multimodal_parts_without_projector_are_500(api: str, part: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    response = chat(api, {"messages": messages, "max_tokens": 2})
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["message"].endswith(
        "input is not supported - hint: if this is unexpected, you may need to provide the mmproj")


def test_malformed_json_is_400(api: str) -> None:
    response = httpx.post(f"{api}/v1/chat/completions", content=b"[1,", timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"

"""POST /v1/messages and /v1/messages/count_tokens driven by the official `anthropic` SDK.

Gemma 3 270M is a base model without a chat template (chatml applies): its words mean nothing,
but shapes, stop reasons, usage and stream/non-stream agreement are checked.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message

USER = [{"role": "user", "content": "Write a short poem about the sea."}]
GREEDY: dict[str, Any] = {"model": "gemma", "extra_body": {"temperature": 0, "top_k": 1}}
"""The SDK has no temperature/top_k arguments any more; the server still takes them."""


@pytest.fixture(scope="module")
def client(api: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=api, api_key="x", max_retries=0, timeout=300)


def create(client: anthropic.Anthropic, **kwargs: Any) -> Message:
    """messages.create with plain dicts (the SDK's TypedDicts are for static callers)."""
    message: Message = client.messages.create(**kwargs)
    return message


def streamed(client: anthropic.Anthropic, **kwargs: Any) -> tuple[str, Message]:
    """The text_stream of messages.stream, and its final message."""
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


def events_of(client: anthropic.Anthropic, **kwargs: Any) -> list[Any]:
    return list(client.messages.create(stream=True, **kwargs))


def count(client: anthropic.Anthropic, **kwargs: Any) -> int:
    return client.messages.count_tokens(**kwargs).input_tokens


def text_of(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def tokens_of(api: str, text: str) -> int:
    response = httpx.post(f"{api}/tokenize", json={"content": text, "add_special": True})
    assert response.status_code == 200, response.text
    return len(response.json()["tokens"])


def chatml(*turns: tuple[str, str]) -> str:
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns) \
        + "<|im_start|>assistant\n"


def test_create_message(client: anthropic.Anthropic, api: str) -> None:
    message = create(client, max_tokens=8, messages=USER, **GREEDY)
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == "gemma"
    assert [block.type for block in message.content] == ["text"]
    assert text_of(message)
    assert message.stop_reason in ("max_tokens", "end_turn")
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == 8
    assert message.stop_sequence is None
    prompt = chatml(("user", USER[0]["content"]))
    cached = message.usage.cache_read_input_tokens or 0
    assert message.usage.input_tokens + cached == tokens_of(api, prompt)


def test_count_tokens(client: anthropic.Anthropic, api: str) -> None:
    system = "You are terse."
    expected = tokens_of(api, chatml(("system", system), ("user", USER[0]["content"])))
    assert count(client, model="gemma", system=system, messages=USER) == expected
    raw = httpx.post(f"{api}/v1/messages/count_tokens",
                     json={"model": "gemma", "messages": USER})
    assert raw.status_code == 200
    assert raw.json() == {"input_tokens": tokens_of(api, chatml(("user", USER[0]["content"])))}
    unnamed = httpx.post(f"{api}/v1/messages/count_tokens", json={"messages": USER})
    assert unnamed.json() == raw.json()  # llama-server needs no model either
    message = create(client, max_tokens=1, system=system, messages=USER, **GREEDY)
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == expected


def test_system_blocks_equal_system_string(client: anthropic.Anthropic) -> None:
    blocks = [{"type": "text", "text": "Be kind. "}, {"type": "text", "text": "Be brief."}]
    as_string = count(client, model="gemma", system="Be kind. Be brief.", messages=USER)
    assert as_string == count(client, model="gemma", system=blocks, messages=USER)
    in_the_list = [{"role": "system", "content": "Be kind. Be brief."}, *USER]
    assert as_string == count(client, model="gemma", messages=in_the_list)


def test_output_format(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    message = create(client, max_tokens=40, messages=USER, **GREEDY,
                     output_config={"format": {"type": "json_schema", "schema": schema}})
    assert json.loads(text_of(message)) in ({"answer": "yes"}, {"answer": "no"})
    assert message.stop_reason == "end_turn"


def test_stream_matches_non_stream(client: anthropic.Anthropic) -> None:
    whole = create(client, max_tokens=12, messages=USER, **GREEDY)
    text, final = streamed(client, max_tokens=12, messages=USER, **GREEDY)
    assert text == text_of(whole) == text_of(final)
    assert final.id.startswith("msg_") and final.model == "gemma"
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == \
        whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)


def test_create_with_stream_true(client: anthropic.Anthropic) -> None:
    events = events_of(client, max_tokens=5, messages=USER, **GREEDY)
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[-2].delta.stop_reason in ("max_tokens", "end_turn")
    assert 0 < events[-2].usage.output_tokens <= 5
    assert events[0].message.usage.input_tokens > 0


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    text = text_of(create(client, max_tokens=24, messages=USER, **GREEDY))
    words = [w for w in text.split() if len(w) > 2 and text.index(w) > 0]
    if not words:
        pytest.skip(f"no word to stop at in {text!r}")
    word = words[0]
    kwargs = {"max_tokens": 24, "messages": USER, "stop_sequences": [word], **GREEDY}
    for stopped in (create(client, **kwargs), streamed(client, **kwargs)[1]):
        assert stopped.stop_reason == "stop_sequence"
        assert stopped.stop_sequence == word
        assert text_of(stopped) == text[:text.index(word)]


def test_tool_history_and_auto_tools(client: anthropic.Anthropic) -> None:
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}]
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 20C"}]},
    ]
    message = create(client, max_tokens=6, messages=history, tools=tools, **GREEDY)
    assert message.stop_reason in ("max_tokens", "end_turn", "tool_use")
    assert {block.type for block in message.content} <= {"text", "tool_use"}
    assert count(client, model="gemma", messages=history, tools=tools) > \
        count(client, model="gemma", messages=history[:1], tools=tools)


WEATHER_TOOLS = [
    {"name": "get_weather", "description": "Weather of a city",
     "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                      "required": ["city"]}},
    {"name": "other", "input_schema": {"type": "object"}},
]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_use(client: anthropic.Anthropic, stream: bool) -> None:
    choice = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    kwargs = {"max_tokens": 200, "messages": USER, "tools": WEATHER_TOOLS,
              "tool_choice": choice, **GREEDY}
    message = streamed(client, **kwargs)[1] if stream else create(client, **kwargs)
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len(calls) == 1, message
    assert calls[0].name == "get_weather" and calls[0].id
    assert calls[0].input in ({"city": "Paris"}, {"city": "Rome"})
    assert message.stop_reason == "tool_use"


def test_any_tool(client: anthropic.Anthropic) -> None:
    tools = [WEATHER_TOOLS[0], {"name": "other", "input_schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}}]
    message = create(client, max_tokens=60, messages=USER, tools=tools, **GREEDY,
                     tool_choice={"type": "any", "disable_parallel_tool_use": True})
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name in ("get_weather", "other"), message
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
def test_prefilled_thinking_becomes_a_thinking_block(client: anthropic.Anthropic,
                                                     stream: bool) -> None:
    """A final assistant message is continued (--prefill-assistant); one that opens a <think>
    tag makes the whole output reasoning, returned as a thinking block."""
    messages = [*USER, {"role": "assistant", "content": "<think>"}]
    kwargs = {"max_tokens": 6, "messages": messages, **GREEDY}
    message = streamed(client, **kwargs)[1] if stream else create(client, **kwargs)
    assert message.content and message.content[0].type == "thinking", message
    assert message.content[0].thinking
    assert message.content[0].signature == ""
    assert message.stop_reason == "max_tokens"

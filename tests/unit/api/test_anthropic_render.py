"""Anthropic message JSON and the streamed event sequence (llama-server's to_json_anthropic*)."""

from __future__ import annotations

import json
from typing import Any

from api.chat.message import ChatDelta, ChatMessage, ToolCall, ToolCallDelta
from api.endpoints.anthropic.render import MessageStream, message_json, sse_error, sse_events
from scheduler.contract.errors import ServerError
from scheduler.contract.results import CompletionResult, Timings


def result(stop_type: str = "eos", word: str = "", evaluated: int = 10, cached: int = 4,
           predicted: int = 3) -> CompletionResult:
    return CompletionResult.model_construct(
        stop_type=stop_type, stopping_word=word, tokens_evaluated=evaluated,
        tokens_predicted=predicted, timings=Timings(cache_n=cached, prompt_n=evaluated - cached))


def message(content: str = "", reasoning: str | None = None,
            calls: list[ToolCall] | None = None) -> ChatMessage:
    return ChatMessage(content=content, reasoning_content=reasoning, tool_calls=calls or [])


def test_message_json_text() -> None:
    body = message_json("msg_1", "gemma", result(), message("Hello"), [])
    assert body == {
        "id": "msg_1", "type": "message", "role": "assistant",
        "content": [{"type": "text", "text": "Hello"}], "model": "gemma",
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"cache_read_input_tokens": 4, "input_tokens": 6, "output_tokens": 3},
    }


def test_message_json_stop_reasons() -> None:
    text = message("x")
    assert message_json("m", "g", result("limit"), text, [])["stop_reason"] == "max_tokens"
    body = message_json("m", "g", result("word", "STOP"), text, ["STOP"])
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "STOP")
    body = message_json("m", "g", result("word", "<|im_end|>"), text, ["STOP"])
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    calls = [ToolCall(id="call_1", name="f", arguments='{"a": 1}')]
    body = message_json("m", "g", result("eos"), message("", None, calls), [])
    assert body["stop_reason"] == "tool_use"
    assert body["content"] == [{"type": "tool_use", "id": "call_1", "name": "f",
                                "input": {"a": 1}}]
    body = message_json("m", "g", result("limit"), message("", None, calls), [])
    assert body["stop_reason"] == "max_tokens"


def test_message_json_block_order_and_bad_arguments() -> None:
    calls = [ToolCall(id="", name="f", arguments="{not json"),
             ToolCall(id="c2", name="g", arguments="[1]")]
    body = message_json("m", "g", result(), message("text", "thought", calls), [])
    kinds = [block["type"] for block in body["content"]]
    assert kinds == ["thinking", "text", "tool_use", "tool_use"]
    assert body["content"][0] == {"type": "thinking", "thinking": "thought", "signature": ""}
    assert body["content"][2]["id"].startswith("toolu_") and body["content"][2]["input"] == {}
    assert body["content"][3]["input"] == {}


def test_empty_message_has_no_blocks() -> None:
    assert message_json("m", "g", result(), message(""), [])["content"] == []


def names(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [name for name, _ in events]


def test_stream_text() -> None:
    stream = MessageStream("msg_1", "gemma")
    events = stream.start(Timings(cache_n=2, prompt_n=5))
    assert events == [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "gemma",
        "stop_reason": None, "stop_sequence": None,
        "usage": {"cache_read_input_tokens": 2, "input_tokens": 5, "output_tokens": 0}}})]
    events = stream.feed([ChatDelta(content="Hel")]) + stream.feed([ChatDelta(content="lo")])
    assert events == [
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "Hel"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "lo"}}),
    ]
    events = stream.finish(result("limit", predicted=2), message("Hello!"))
    assert events == [
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": "!"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                           "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_stream_thinking_text_and_tools() -> None:
    stream = MessageStream("m", "g")
    events = stream.feed([ChatDelta(reasoning_content="hmm")])
    events += stream.feed([ChatDelta(content="ok")])
    events += stream.feed([ChatDelta(tool_calls=[ToolCallDelta(0, "c1", "f", '{"a"')])])
    events += stream.feed([ChatDelta(tool_calls=[ToolCallDelta(0, None, None, ": 1}")])])
    calls = [ToolCall(id="c1", name="f", arguments='{"a": 1}'),
             ToolCall(id="c2", name="g", arguments="{}")]
    events += stream.finish(result("eos"), message("ok", "hmm", calls))
    assert names(events) == [
        "content_block_start", "content_block_delta",  # thinking 0
        "content_block_start", "content_block_delta",  # text 1
        "content_block_start", "content_block_delta", "content_block_delta",  # tool 2
        "content_block_start", "content_block_delta",  # tool 3, from the final message
        "content_block_delta", "content_block_stop",  # signature, stop 0
        "content_block_stop", "content_block_stop", "content_block_stop",
        "message_delta", "message_stop",
    ]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2, 3]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": ""}
    assert starts[2]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f",
                                          "input": {}}
    assert events[5][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a"'}
    assert events[9][1] == {"type": "content_block_delta", "index": 0,
                            "delta": {"type": "signature_delta", "signature": ""}}
    assert [data["index"] for name, data in events if name == "content_block_stop"] == [
        0, 1, 2, 3]
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_stream_without_output() -> None:
    stream = MessageStream("m", "g", ["END"])
    events = stream.start(None) + stream.finish(result("word", "END", predicted=1), message())
    assert names(events) == ["message_start", "message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 0
    assert events[1][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_sse_framing() -> None:
    text = sse_events([("message_stop", {"type": "message_stop"}),
                       ("ping", {"type": "ping"})])
    assert text == ('event: message_stop\ndata: {"type":"message_stop"}\n\n'
                    'event: ping\ndata: {"type":"ping"}\n\n')
    error = sse_error(ServerError("boom"))
    name, data = error.strip().split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "type": "error", "error": {"code": 500, "message": "boom", "type": "server_error"}}

"""OpenAI rendering: objects, chunks, usage, logprobs, the chat stream's deltas (tool calls,
reasoning) and the Responses events — from synthetic results, no model needed."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from api.chat.message import ChatDelta, ChatMessage, ToolCall, ToolCallDelta
from api.chat.prepare import PreparedChat
from api.chat.request_tools import ToolChoice, validate_tools
from api.chat.templates import ChatTemplate
from api.endpoints.openai.chat import ChatPlan, ChatStream
from api.endpoints.openai.protocol import ChatCompletionRequest
from api.endpoints.openai.render import (
    Envelope,
    ResponseEvents,
    chat_completion_json,
    delta_json,
    finish_reason,
    logprobs_json,
    message_json,
    response_json,
    sse_event,
    text_completion_json,
    usage_json,
)
from scheduler.contract.results import (
    Candidate,
    CompletionResult,
    FinalEvent,
    Timings,
    TokenEvent,
    TokenProbs,
)

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def result(content: str = "", stop_type: str = "eos", predicted: int = 3, evaluated: int = 10,
           cached: int = 4, **extra: Any) -> CompletionResult:
    return CompletionResult.model_construct(
        content=content, stop_type=stop_type, tokens_predicted=predicted,
        tokens_evaluated=evaluated, timings=Timings(cache_n=cached, predicted_n=predicted),
        probs=[], post_sampling_probs=False, **extra)


def envelope() -> Envelope:
    return Envelope("chatcmpl-x", "gemma", created=123)


@pytest.mark.parametrize(("stop_type", "tools", "expected"), [
    ("eos", False, "stop"), ("word", False, "stop"), ("limit", False, "length"),
    ("none", False, "length"), ("eos", True, "tool_calls"), ("limit", True, "length"),
])
def test_finish_reason(stop_type: str, tools: bool, expected: str) -> None:
    assert finish_reason(result(stop_type=stop_type), tools) == expected


def test_usage_counts_a_shared_prompt_once() -> None:
    usage = usage_json([result(predicted=3), result(predicted=5)])
    assert usage == {"completion_tokens": 8, "prompt_tokens": 10, "total_tokens": 18,
                     "prompt_tokens_details": {"cached_tokens": 4}}
    per_prompt = usage_json([result(), result(), result(evaluated=7), result(evaluated=7)], 2)
    assert per_prompt["prompt_tokens"] == 17 and per_prompt["completion_tokens"] == 12


def test_logprobs() -> None:
    probs = [TokenProbs(id=5, token="hi", bytes=[104, 105], p=0.5,
                        top=[Candidate(id=5, token="hi", bytes=[104, 105], p=0.5),
                             Candidate(id=6, token="x", bytes=[120], p=0.0)])]
    (entry,) = (logprobs_json(probs) or {})["content"]
    assert entry["id"] == 5 and entry["token"] == "hi" and entry["bytes"] == [104, 105]
    assert entry["logprob"] == pytest.approx(math.log(0.5))
    assert [c["id"] for c in entry["top_logprobs"]] == [5, 6]
    assert entry["top_logprobs"][1]["logprob"] < -1e30  # log(0) as the lowest float
    post = (logprobs_json(probs, post_sampling=True) or {})["content"][0]
    assert post["prob"] == 0.5 and "top_probs" in post
    assert logprobs_json([]) is None


def test_text_completion_object() -> None:
    body = text_completion_json(Envelope("cmpl-1", "gemma", 1),
                                [result("a"), result("b", stop_type="limit")])
    assert body["object"] == "text_completion" and body["id"] == "cmpl-1"
    assert body["model"] == "gemma" and body["created"] == 1 and body["system_fingerprint"]
    assert body["choices"] == [
        {"text": "a", "index": 0, "logprobs": None, "finish_reason": "stop"},
        {"text": "b", "index": 1, "logprobs": None, "finish_reason": "length"}]
    assert body["usage"]["completion_tokens"] == 6 and body["timings"]["cache_n"] == 4


def test_message_json() -> None:
    assert message_json(ChatMessage("hi")) == {"role": "assistant", "content": "hi"}
    message = ChatMessage("", "thought", [ToolCall("id1", "f", '{"a":1}')])
    assert message_json(message) == {
        "role": "assistant", "content": "", "reasoning_content": "thought",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"a":1}'},
                        "id": "id1"}]}


def test_chat_completion_object() -> None:
    message = ChatMessage("", None, [ToolCall("i", "f", "{}")])
    body = chat_completion_json(envelope(), [(0, result(), message)])
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls" and "logprobs" not in choice
    assert body["usage"]["total_tokens"] == 13


def test_delta_json() -> None:
    assert delta_json(ChatDelta(content="a")) == {"content": "a"}
    assert delta_json(ChatDelta(reasoning_content="r")) == {"reasoning_content": "r"}
    assert delta_json(ChatDelta()) == {}
    header = delta_json(ChatDelta(tool_calls=[ToolCallDelta(0, "id", "f", "")]))
    assert header == {"tool_calls": [{"index": 0, "id": "id", "type": "function",
                                      "function": {"name": "f"}}]}
    arguments = delta_json(ChatDelta(tool_calls=[ToolCallDelta(0, arguments='{"a"')]))
    assert arguments == {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}


# the chat stream, on synthetic events


def plan(tools: bool = False, reasoning_format: str = "auto", **body: Any) -> ChatPlan:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "stream": True, **body})
    return ChatPlan(request, PreparedChat(
        ChatTemplate.builtin_named("chatml"), "<prompt>", validate_tools([TOOL]) if tools else [],
        ToolChoice("auto"), None, reasoning_format, tools))


def run_stream(chat_plan: ChatPlan, pieces: list[str], n: int = 1,
               final: CompletionResult | None = None) -> list[Any]:
    jobs = chat_plan.jobs("gemma")[:n] if n == 1 else chat_plan.jobs("gemma")
    stream = ChatStream(chat_plan, envelope(), jobs)
    out: list[str] = []
    for index in range(len(jobs)):
        for piece in pieces:
            out.extend(stream.render(index, TokenEvent(content=piece, tokens=[1])))
        out.extend(stream.render(index, FinalEvent.model_construct(
            result=final or result(stop_type="eos"))))
    out.extend(stream.end())
    assert all(text.startswith("data: ") and text.endswith("\n\n") for text in out)
    return [json.loads(text.removeprefix("data: ")) for text in out]


def deltas(chunks: list[Any]) -> list[dict[str, Any]]:
    return [c["choices"][0]["delta"] for c in chunks if c["choices"]]


def test_chat_stream_plain_text() -> None:
    chunks = run_stream(plan(), ["Hel", "lo", " there"])
    assert deltas(chunks)[0] == {"role": "assistant", "content": None}
    assert "".join(d.get("content") or "" for d in deltas(chunks)) == "Hello there"
    final = chunks[-1]
    assert final["choices"][0] == {"finish_reason": "stop", "index": 0, "delta": {}}
    assert "timings" in final and "usage" not in final
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["id"] for c in chunks} == {"chatcmpl-x"}


def test_chat_stream_reasoning() -> None:
    chunks = run_stream(plan(), ["<think>", "let me", " see</think>", "Answer"])
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas(chunks))
    content = "".join(d.get("content") or "" for d in deltas(chunks))
    assert reasoning == "let me see" and content == "Answer"


def test_chat_stream_reasoning_format_none() -> None:
    chunks = run_stream(plan(reasoning_format="none"), ["<think>x</think>y"])
    assert "".join(d.get("content") or "" for d in deltas(chunks)) == "<think>x</think>y"


def test_chat_stream_tool_call() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    chunks = run_stream(plan(tools=True), pieces)
    calls = [call for d in deltas(chunks) for call in d.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    assert calls[0]["type"] == "function" and calls[0]["index"] == 0
    arguments = "".join(call.get("function", {}).get("arguments", "") for call in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert not "".join(d.get("content") or "" for d in deltas(chunks)).strip()


def test_chat_stream_choices_and_usage() -> None:
    chat_plan = plan(n=2, stream_options={"include_usage": True})
    chunks = run_stream(chat_plan, ["a"], n=2, final=result(stop_type="limit", predicted=1))
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
    assert "timings" in usage
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [c["choices"][0]["index"] for c in finishes] == [0, 1]
    assert all("timings" not in c for c in finishes)


def test_chat_stream_logprobs_on_the_token_chunk() -> None:
    chat_plan = plan(logprobs=True)
    stream = ChatStream(chat_plan, envelope(), chat_plan.jobs("gemma"))
    probs = [TokenProbs(id=1, token="a", bytes=[97], p=1.0, top=[])]
    texts = stream.render(0, TokenEvent(content="a", tokens=[1], probs=probs))
    last = json.loads(list(texts)[-1].removeprefix("data: "))
    assert last["choices"][0]["logprobs"]["content"][0]["logprob"] == 0.0


# Responses


def test_response_object() -> None:
    message = ChatMessage("hello", "thinking", [ToolCall("abc", "f", "{}")])
    body = response_json(Envelope("resp_1", "gemma", 5), message, [result()])
    assert body["object"] == "response" and body["status"] == "completed"
    kinds = [item["type"] for item in body["output"]]
    assert kinds == ["reasoning", "message", "function_call"]
    assert body["output"][1]["content"][0] == {"type": "output_text", "annotations": [],
                                               "logprobs": [], "text": "hello"}
    call = body["output"][2]
    assert (call["id"], call["call_id"], call["name"]) == ("fc_abc", "call_abc", "f")
    assert body["usage"] == {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13,
                             "input_tokens_details": {"cached_tokens": 4}}


def test_response_events() -> None:
    events = ResponseEvents(Envelope("resp_1", "gemma", 5))
    out = events.start()
    out += events.delta(ChatDelta(reasoning_content="hm"))
    out += events.delta(ChatDelta(content="Hi"))
    out += events.delta(ChatDelta(tool_calls=[ToolCallDelta(0, "abc", "f", "")]))
    out += events.delta(ChatDelta(tool_calls=[ToolCallDelta(0, arguments="{}")]))
    out += events.finish(ChatMessage("Hi", "hm", [ToolCall("abc", "f", "{}")]), [result()])
    names = [name for name, _ in out]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.output_item.done",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.done", "response.completed"]
    assert [data["sequence_number"] for _, data in out] == list(range(len(out)))
    assert all(data["type"] == name for name, data in out)
    added = [data for name, data in out if name == "response.output_item.added"]
    assert [a["output_index"] for a in added] == [0, 1, 2]
    assert out[8][1]["item_id"] == "fc_abc"
    completed = out[-1][1]["response"]
    assert [item["type"] for item in completed["output"]] == [
        "reasoning", "message", "function_call"]
    assert completed["id"] == "resp_1" and "timings" in out[-1][1]
    assert sse_event(out[0]).startswith("event: response.created\ndata: {")

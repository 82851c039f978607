"""Anthropic Messages requests: validation and conversion to OpenAI-style chat messages."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from api.chat.request_tools import ToolChoice
from api.endpoints.anthropic.protocol import MessagesRequest, normalize_billing_header
from scheduler.contract.errors import ServerError


def request(**fields: Any) -> MessagesRequest:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return MessagesRequest.model_validate({**body, **fields})


def test_defaults() -> None:
    body = request()
    assert (body.max_tokens, body.temperature, body.top_p, body.top_k) == (4096, 1.0, 1.0, None)
    job = body.to_job("gemma", "PROMPT")
    assert job.n_predict == 4096 and job.prompt == "PROMPT" and not job.stream
    assert job.sampling.temperature == 1.0 and job.sampling.top_p == 1.0
    assert job.sampling.top_k is None and job.stop == []


def test_sampling_stop_and_stream_to_job() -> None:
    body = request(max_tokens=7, temperature=0, top_p=0.5, top_k=3, stop_sequences=["X"],
                   stream=True, metadata={"user_id": "u"}, service_tier="auto")
    job = body.to_job("gemma", "P", json_schema='{"type": "object"}')
    assert job.n_predict == 7 and job.stream and job.timings_per_token
    assert (job.sampling.temperature, job.sampling.top_p, job.sampling.top_k) == (0, 0.5, 3)
    assert job.stop == ["X"] and job.json_schema == '{"type": "object"}'


def test_nulls_are_absent() -> None:
    body = request(system=None, temperature=None, top_k=None, tools=None, max_tokens=None)
    assert body.temperature == 1.0 and body.max_tokens == 4096 and body.system is None


def test_model_may_be_absent() -> None:
    """llama-server answers /v1/messages and /v1/messages/count_tokens without a `model`."""
    body = MessagesRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]})
    assert body.model is None


@pytest.mark.parametrize("fields", [
    {"model": 5},
    {"messages": "hi"},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "system", "content": [{"type": "tool_use", "id": "i", "name": "n"}]}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": 3}]},
    {"messages": [{"role": "user", "content": [{"type": "video", "x": 1}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    {"max_tokens": 0},
    {"max_tokens": "10"},
    {"temperature": "hot"},
    {"stop_sequences": "X"},
    {"tools": [{"name": "f"}]},
    {"tools": [{"name": "f", "input_schema": {"type": "string"}}]},
    {"tools": [{"name": "", "input_schema": {}}]},
    {"tools": [{"name": "f", "input_schema": []}]},
    {"tools": [{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}]},
    {"tool_choice": {"type": "sometimes"}},
    {"tool_choice": "auto"},
    {"tool_choice": {"type": "any"}},
    {"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool"}},
    {"tools": [{"name": "f", "input_schema": {}}],
     "tool_choice": {"type": "tool", "name": "g"}},
    {"thinking": {"type": "on"}},
    {"output_config": {"format": {"type": "json_object"}}},
    {"output_config": {"format": {"type": "json_schema"}}},
    {"system": 5},
])
def test_bad_requests(fields: dict[str, Any]) -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(fields)
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(ValidationError):
        MessagesRequest.model_validate(body)


def test_system_string_and_blocks() -> None:
    assert request(system="Be brief.").to_chat().messages[0] == {
        "role": "system", "content": "Be brief."}
    blocks = [{"type": "text", "text": "A. ", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "B."}]
    chat = request(system=blocks).to_chat()
    assert chat.messages == [{"role": "system", "content": "A. B."},
                             {"role": "user", "content": "hi"}]


def test_system_messages_in_the_list() -> None:
    chat = request(system="S", messages=[
        {"role": "system", "content": [{"type": "text", "text": "T"}]},
        {"role": "user", "content": "hi"}]).to_chat()
    assert chat.messages == [{"role": "system", "content": "S"},
                             {"role": "system", "content": [{"type": "text", "text": "T"}]},
                             {"role": "user", "content": "hi"}]


def test_output_format_schema() -> None:
    assert request().to_job("g", "p").json_schema is None
    body = request(output_config={"effort": "low", "format": {
        "type": "json_schema", "schema": {"type": "object", "properties": {"a": {}}}}})
    assert body.to_job("g", "p").json_schema == \
        '{"type": "object", "properties": {"a": {}}}'
    assert body.to_job("g", "p", json_schema="{}").json_schema == "{}"
    empty = request(output_config={"format": {"type": "json_schema", "schema": {}}})
    assert empty.to_job("g", "p").json_schema == '{"type": "object"}'


def test_content_blocks_tool_use_and_results() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need the tool.", "signature": "sig"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather",
             "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "20C"},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"type": "tool_result", "tool_use_id": "toolu_3", "is_error": True},
        ]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"},
                                          {"type": "tool_use", "id": "t", "name": "n"}]},
    ]
    chat = request(messages=messages).to_chat()
    assert chat.messages == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check."}],
         "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
             "name": "weather", "arguments": '{"city": "Paris"}'}}],
         "reasoning_content": "Need the tool."},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "20C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "ab"},
        {"role": "tool", "tool_call_id": "toolu_3", "content": ""},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "n", "arguments": "{}"}}]},
    ]


def test_image_blocks_become_image_url_parts() -> None:
    """llama-server's conversion: a base64 source as a data URI, a URL as it is (the chat
    preparation then needs a projector: a 500 without one, api/chat/messages.py)."""
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": "AA=="}},
              {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]
    chat = request(messages=[{"role": "user", "content": blocks}]).to_chat()
    assert chat.messages[-1]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]


@pytest.mark.parametrize("content", [
    [{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}],
])
def test_images_need_a_projector(content: list[dict[str, Any]]) -> None:
    body = request(messages=[{"role": "user", "content": content}])
    with pytest.raises(ServerError) as info:  # llama-server's 500 without an mmproj
        body.to_chat()
    assert info.value.status == 500
    assert info.value.message == ("image input is not supported - hint: if this is "
                                  "unexpected, you may need to provide the mmproj")


def test_images_of_other_sources_are_dropped() -> None:
    """llama-server passes base64 and url images on, and leaves other sources out."""
    image = {"type": "image", "source": {"type": "file", "file_id": "f"}}
    body = request(messages=[{"role": "user", "content": [image, {"type": "text",
                                                                  "text": "hi"}]}])
    assert body.to_chat().messages == [{"role": "user",
                                        "content": [{"type": "text", "text": "hi"}]}]


def test_tools_and_tool_choice() -> None:
    tools = [{"name": "a", "description": "A", "input_schema": {"type": "object"}},
             {"name": "b", "input_schema": {"type": "object", "properties": {}},
              "cache_control": {"type": "ephemeral"}}]
    chat = request(tools=tools).to_chat()
    assert chat.tools == [
        {"type": "function", "function": {"name": "a", "description": "A",
                                          "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "b", "description": "",
                                          "parameters": {"type": "object", "properties": {}}}},
    ]
    assert (chat.tool_choice, chat.parallel_tool_calls) == (ToolChoice("auto"), True)
    chat = request(tools=tools, tool_choice={"type": "any"}).to_chat()
    assert chat.tool_choice == ToolChoice("required")
    chat = request(tools=tools, tool_choice={"type": "tool", "name": "b",
                                             "disable_parallel_tool_use": True}).to_chat()
    assert (chat.tool_choice, chat.parallel_tool_calls) == (ToolChoice("required", "b"), False)
    assert request(tools=tools, tool_choice={"type": "none"}).to_chat().tool_choice == \
        ToolChoice("none")
    assert request().to_chat().tools == []


def test_thinking_budget_and_template_kwargs() -> None:
    assert request().to_chat().reasoning_budget is None
    assert request(thinking={"type": "enabled", "budget_tokens": 2048}).to_chat() \
        .reasoning_budget == 2048
    assert request(thinking={"type": "enabled"}).to_chat().reasoning_budget == 10000
    assert request(thinking={"type": "disabled"}).to_chat().reasoning_budget is None
    chat = request(chat_template_kwargs={"enable_thinking": False}).to_chat()
    assert chat.chat_template_kwargs == {"enable_thinking": False}


def test_billing_header_is_pinned() -> None:
    header = ("x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; "
              "cch=a5145;You are Claude Code.")
    assert normalize_billing_header(header) == header.replace("cch=a5145;", "cch=fffff;")
    assert normalize_billing_header("cch=a5145; plain") == "cch=a5145; plain"
    chat = request(system=[{"type": "text", "text": header}]).to_chat()
    assert "cch=fffff;" in chat.messages[0]["content"]

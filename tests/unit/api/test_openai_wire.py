"""OpenAI wire models: field mapping to jobs, response_format, Responses → chat conversion."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from api.endpoints.openai.protocol import (
    SCHEMA_NOT_OBJECT,
    ChatCompletionRequest,
    ControlRequest,
    OpenAICompletionRequest,
    ReasoningFormat,
    responses_to_chat,
    schema_of_response_format,
)
from api.settings import REASONING_FORMATS
from scheduler.contract.errors import InvalidRequest

HELLO = [{"role": "user", "content": "hi"}]


def completion(**body: Any) -> OpenAICompletionRequest:
    return OpenAICompletionRequest.model_validate({"prompt": "p", **body})


def chat(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": HELLO, **body})


def test_reasoning_formats_match_the_settings() -> None:
    assert set(ReasoningFormat.__args__) == set(REASONING_FORMATS)  # type: ignore[attr-defined]


@pytest.mark.parametrize(("body", "expected"), [
    ({}, None),
    ({"max_tokens": 5}, 5),
    ({"max_completion_tokens": 6, "max_tokens": 5}, 6),
    ({"n_predict": 7, "max_completion_tokens": 6, "max_tokens": 5}, 7),
    ({"max_tokens": -1}, -1),
    ({"max_tokens": None}, None),
])
def test_token_limit_precedence(body: dict[str, Any], expected: int | None) -> None:
    (job,) = completion(**body).to_jobs("m")
    assert job.n_predict == expected


def test_completion_jobs_per_prompt_and_choice() -> None:
    jobs = completion(prompt=["a", "b"], n=2).to_jobs("m")
    assert [job.prompt for job in jobs] == ["a", "a", "b", "b"]
    assert len({job.job_id for job in jobs}) == 4


def test_sampling_and_llama_options_reach_the_job() -> None:
    (job,) = completion(temperature=0.5, top_p=0.9, seed=3, presence_penalty=0.2,
                        frequency_penalty=0.1, stop="\n", top_k=4, mirostat=2,
                        repeat_penalty=1.2, min_p=0.05, logit_bias={"12": -5, "7": False},
                        grammar='root ::= "a"', logprobs=3, stream=True).to_jobs("m")
    s = job.sampling
    assert (s.temperature, s.top_p, s.seed, s.top_k, s.mirostat) == (0.5, 0.9, 3, 4, 2)
    assert (s.presence_penalty, s.frequency_penalty, s.repeat_penalty, s.min_p) == (
        0.2, 0.1, 1.2, 0.05)
    assert job.stop == ["\n"] and job.stream is True
    assert job.grammar == 'root ::= "a"' and job.json_schema is None
    assert job.n_probs == 3
    assert {(b.token, b.bias) for b in job.logit_bias} == {(12, -5.0), (7, None)}


def test_nulls_are_absent() -> None:
    request = chat(stop=None, temperature=None, logprobs=None, tools=None, n=None,
                   response_format=None, stream_options=None)
    (job,) = request.chat_jobs("m", "prompt")
    assert job.stop == [] and job.sampling.temperature is None and job.n_probs == 0


@pytest.mark.parametrize("body", [
    {"echo": True}, {"best_of": 2}, {"suffix": "s"}, {"n": 0}, {"max_tokens": -2},
    {"logprobs": -1}, {"max_tokens": "3"}, {"stream_options": {"include_usage": "yes"}},
])
def test_bad_completion_bodies(body: dict[str, Any]) -> None:
    with pytest.raises((InvalidRequest, ValidationError)):
        completion(**body).to_jobs("m")


@pytest.mark.parametrize(("response_format", "schema"), [
    ({"type": "text"}, None),
    ({"type": "json_object"}, {}),
    ({"type": "json_object", "schema": {"type": "string"}}, {"type": "string"}),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
     {"type": "array"}),
    ({"type": "json_schema", "schema": {"type": "number"}}, {"type": "number"}),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, {}),
])
def test_response_formats(response_format: dict[str, Any], schema: Any) -> None:
    assert schema_of_response_format(response_format) == schema


def test_response_format_becomes_the_job_schema() -> None:
    (job,) = chat(response_format={"type": "json_object"}).chat_jobs("m", "p")
    assert json.loads(job.json_schema or "") == {"type": "object"}
    (job,) = chat(json_schema={"type": "string"}).chat_jobs("m", "p")
    assert json.loads(job.json_schema or "") == {"type": "string"}


def test_a_schema_that_is_no_object_is_a_400() -> None:
    """llama-server's schema conversion refuses it with this message (a 400, measured on the
    vendored build with --no-jinja; /completion's json_schema answers the same); a null schema
    is an absent one."""
    for fmt in ({"type": "json_object", "schema": "x"}, {"type": "json_object", "schema": 123},
                {"type": "json_object", "schema": [1]},
                {"type": "json_schema", "json_schema": {"schema": 123}}):
        with pytest.raises(InvalidRequest) as caught:
            chat(response_format=fmt).chat_jobs("m", "p")
        assert str(caught.value) == SCHEMA_NOT_OBJECT
    (job,) = chat(response_format={"type": "json_object", "schema": None}).chat_jobs("m", "p")
    assert json.loads(job.json_schema or "") == {"type": "object"}


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "yaml"}},
    {"grammar": "root ::= x", "response_format": {"type": "json_object"}},
])
def test_bad_response_formats(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        chat(**body).chat_jobs("m", "p")


def test_chat_logprobs() -> None:
    assert chat().probs_wanted() == 0
    assert chat(logprobs=True).probs_wanted() == 20
    assert chat(logprobs=True, top_logprobs=2).probs_wanted() == 2
    assert chat(logprobs=True, top_logprobs=0).probs_wanted() == 0
    with pytest.raises(InvalidRequest, match="top_logprobs requires logprobs"):
        chat(top_logprobs=2)


def test_chat_choices_and_usage_option() -> None:
    request = chat(n=3, stream=True, stream_options={"include_usage": True})
    assert request.choices == 3 and request.include_usage
    assert len(request.chat_jobs("m", "p")) == 3
    assert not chat(stream=True).include_usage


def test_tool_schema_replaces_grammar_and_response_format() -> None:
    (job,) = chat(response_format={"type": "json_object"}).chat_jobs("m", "p", '{"x": 1}')
    assert job.json_schema == '{"x": 1}' and job.grammar is None


@pytest.mark.parametrize("body", [
    {"tools": [{"type": "function", "function": {"name": "f"}}], "grammar": "root ::= x"},
    {"continue_final_message": True},
    {"continue_final_message": "content"},  # with add_generation_prompt (true by default)
    {"reasoning_format": "loud"},
    {"top_logprobs": 30, "logprobs": True},
    {"logprobs": True, "stream": True, "tools": [{"type": "function"}]},
])
def test_bad_chat_bodies(body: dict[str, Any]) -> None:
    with pytest.raises((InvalidRequest, ValidationError)):
        chat(**body)


def test_control_request() -> None:
    assert ControlRequest.model_validate({"id": "c", "action": "reasoning_end"}).action == (
        "reasoning_end")
    assert ControlRequest.model_validate({"id": "c", "reasoning_end": True}).action == (
        "reasoning_end")
    for body in ({"action": "reasoning_end"}, {"id": "c"}, {"id": "c", "action": "x"}):
        with pytest.raises(InvalidRequest):
            ControlRequest.model_validate(body)


# Responses → chat


def test_responses_string_input_and_options() -> None:
    body = responses_to_chat({"model": "m", "input": "hi", "instructions": "be nice",
                              "max_output_tokens": 5, "reasoning": {"effort": "low"},
                              "stream": True, "temperature": 0})
    assert body["messages"] == [{"role": "system", "content": "be nice"},
                                {"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 5 and body["reasoning_effort"] == "low"
    assert body["stream"] is True and body["temperature"] == 0 and body["model"] == "m"
    for gone in ("input", "instructions", "max_output_tokens", "reasoning"):
        assert gone not in body


def test_responses_items() -> None:
    body = responses_to_chat({"input": [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "think"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "answer"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]})
    messages = body["messages"]
    assert messages[0] == {"role": "developer", "content": [{"type": "text", "text": "rules"}]}
    assert messages[1]["content"] == [{"type": "text", "text": "a"},
                                      {"type": "text", "text": "b"}]
    assistant = messages[2]
    assert assistant["role"] == "assistant" and assistant["reasoning_content"] == "think"
    assert assistant["content"] == [{"type": "text", "text": "answer"}]
    assert assistant["tool_calls"] == [{"type": "function", "id": "c1",
                                        "function": {"name": "f", "arguments": "{}"}}]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert len(messages) == 4


def test_responses_tools_and_tool_choice() -> None:
    body = responses_to_chat({"input": "x", "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "f"}})
    assert body["tools"] == [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object"}, "strict": True}}]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_responses_text_format() -> None:
    body = responses_to_chat({"input": "x", "text": {"format": {
        "type": "json_schema", "name": "n", "schema": {"type": "object"}}}})
    assert body["response_format"] == {"type": "json_schema", "schema": {"type": "object"}}
    assert "text" not in body


@pytest.mark.parametrize("body", [
    {},
    {"input": "x", "previous_response_id": "r"},
    {"input": 3},
    {"input": ["x"]},
    {"input": [{"type": "what"}]},
    {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
    {"input": [{"type": "function_call", "name": "f"}]},
    {"input": [{"type": "reasoning", "summary": [], "content": []}]},
    {"input": "x", "tools": "f"},
])
def test_bad_responses_bodies(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        responses_to_chat(body)

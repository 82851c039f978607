"""Wire models of the OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, their
token counting and control endpoints. Every llama.cpp-specific /completion option is accepted
too (the fields of the native `CompletionRequest`), as llama-server does."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from api.body import drop_nulls
from api.chat.template_messages import continuation_mode
from api.endpoints.native.protocol import CompletionRequest
from scheduler.contract import limits
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, PromptPiece

MAX_CHOICES = 128
"""The largest `n` we accept (llama-server's limit is its slot count)."""
DEFAULT_TOP_LOGPROBS = 20
"""Chat `logprobs: true` without `top_logprobs` asks for this many candidates, as llama-server."""
UNSUPPORTED_COMPLETION_PARAMS = ("best_of", "suffix")
SCHEMA_NOT_OBJECT = ("JSON schema conversion failed:\n"
                     "JSON schema error at #: schema must be an object")
"""llama-server's 400 for a `response_format` schema that is not a JSON object (its message)."""


class StreamOptions(DeferredModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class OpenAIOptions(CompletionRequest):
    """What /v1/completions and /v1/chat/completions share: OpenAI's sampling and output
    options on top of llama.cpp's. A field sent as `null` counts as absent, as in llama-server."""

    model_config = ConfigDict(extra="ignore", strict=True)
    native_aliases: ClassVar[bool] = False

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=-1)
    max_completion_tokens: int | None = Field(default=None, ge=-1)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream_options: StreamOptions | None = None
    response_format: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return drop_nulls(data)

    @property
    def choices(self) -> int:
        """`n` (or llama.cpp's `n_cmpl`): completions per prompt."""
        return self.n_cmpl if self.n_cmpl > 1 else self.n

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def predict_limit(self) -> int | None:
        """n_predict, else max_completion_tokens, else max_tokens (llama-server's order)."""
        for value in (self.n_predict, self.max_completion_tokens, self.max_tokens):
            if value is not None:
                return value
        return None

    def schema_text(self) -> str | None:
        """The JSON schema constraining the output, as JSON text: `json_schema`, or the one
        `response_format` asks for. An empty schema means any object."""
        schema = self.json_schema
        if self.response_format is not None:
            from_format = schema_of_response_format(self.response_format)
            if from_format is not None:
                schema = from_format
        if schema is not None and self.grammar:
            raise InvalidRequest("Cannot use both json_schema and grammar")
        if schema is None:
            return None
        return json.dumps({"type": "object"} if schema == {} else schema)

    def job(self, model: str, prompt: str | list[PromptPiece]) -> CompletionJob:
        job = super().job(model, prompt)
        job.n_predict = self.predict_limit()
        job.grammar = self.grammar or None
        job.json_schema = self.schema_text()
        return job


def schema_of_response_format(response_format: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's {"type": "json_object"} and {"type": "json_schema", "json_schema": {"schema":
    …}}, and llama.cpp's {"type": "json_object" | "json_schema", "schema": …}; None for text."""
    kind = response_format.get("type", "")
    if kind in ("", "text"):
        return None
    if kind not in ("json_object", "json_schema"):
        raise InvalidRequest('response_format type must be one of "text", "json_object" or '
                             f'"json_schema", but got: {kind}')
    schema = response_format.get("schema")
    wrapper = response_format.get("json_schema")
    if schema is None and kind == "json_schema" and isinstance(wrapper, dict):
        schema = wrapper.get("schema")
    if schema is None:  # absent (or null): any object
        return {}
    if not isinstance(schema, dict):  # llama-server's schema conversion refuses it
        raise InvalidRequest(SCHEMA_NOT_OBJECT)
    return schema


class OpenAICompletionRequest(OpenAIOptions):
    """POST /v1/completions."""

    logprobs: int | None = Field(default=None, ge=0)
    echo: bool = False
    best_of: Any = None
    suffix: Any = None

    @model_validator(mode="after")
    def _supported(self) -> OpenAICompletionRequest:
        if self.echo:
            raise InvalidRequest("Only no echo is supported")
        for name in UNSUPPORTED_COMPLETION_PARAMS:
            if getattr(self, name) is not None:
                raise InvalidRequest(f"Unsupported param: {name}")
        return self

    def probs_wanted(self) -> int:
        return self.n_probs or self.logprobs or 0

    def to_jobs(self, model: str) -> list[CompletionJob]:
        """One job per prompt and choice; choice index = prompt index * n + j."""
        prompts = self.prompts()
        limits.check_fan_out(len(prompts), self.choices, limits.MAX_PROMPTS)
        jobs: list[CompletionJob] = []
        for prompt in prompts:
            if not prompt:
                raise InvalidRequest("The prompt is empty")
            jobs.extend(self.job(model, prompt) for _ in range(self.choices))
        return jobs


ReasoningFormat = Literal["none", "deepseek", "deepseek-legacy", "auto"]


class ChatCompletionRequest(OpenAIOptions):
    """POST /v1/chat/completions. `messages`, `tools` and `tool_choice` are checked by the
    chat layer (api/chat/messages.py, request_tools.py) when the prompt is rendered."""

    prompt: Any = None  # not a chat field; ignored
    messages: list[Any]
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning_format: ReasoningFormat | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool | str | None = None
    """True, or "content" / "reasoning_content": the part of the final message continued
    (another string: not continued, as llama-server reads it)."""
    reasoning_control: bool = False
    reasoning_budget_tokens: int | None = Field(default=None, ge=-1)
    thinking_budget_tokens: int | None = Field(default=None, ge=-1)
    reasoning_budget_message: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if continuation_mode(self.continue_final_message) and self.add_generation_prompt:
            raise InvalidRequest("Cannot set both add_generation_prompt and "
                                 "continue_final_message to true.")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be set to true")
        if self.logprobs and self.stream and self.tools:
            raise InvalidRequest("logprobs is not supported with tools + stream")
        if self.tools and self.tool_choice != "none" and self.grammar:
            raise InvalidRequest("Cannot use custom grammar constraints with tools.")
        return self

    def probs_wanted(self) -> int:
        if self.n_probs:
            return self.n_probs
        if not self.logprobs:
            return 0
        return self.top_logprobs if self.top_logprobs is not None else DEFAULT_TOP_LOGPROBS

    def chat_jobs(self, model: str, prompt: str,
                  tool_schema: str | None = None) -> list[CompletionJob]:
        """`n` jobs on the rendered prompt; `tool_schema` (JSON text) constrains the output to
        a tool call when tool_choice demands one, instead of grammar / response_format."""
        limits.check_fan_out(1, self.choices, limits.MAX_PROMPTS)
        jobs = [self.job(model, prompt) for _ in range(self.choices)]
        if tool_schema:
            for job in jobs:
                job.grammar, job.json_schema = None, tool_schema
        return jobs


class ControlRequest(DeferredModel):
    """POST /v1/chat/completions/control: {"id": …, "action": "reasoning_end"}; the form
    {"id": …, "reasoning_end": true} is accepted too."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str = ""
    action: str = ""
    reasoning_end: bool = False
    model: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> ControlRequest:
        if not self.id:
            raise InvalidRequest("missing completion id")
        if self.reasoning_end and not self.action:
            self.action = "reasoning_end"
        if self.action != "reasoning_end":
            raise InvalidRequest("unknown control action")
        return self


# The Responses API, converted to a chat completion (server-chat.cpp
# server_chat_convert_responses_to_chatcmpl)

RESPONSES_ONLY_FIELDS = ("input", "instructions", "max_output_tokens", "reasoning", "text",
                         "tools")


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/responses body as the /v1/chat/completions body it means."""
    if "input" not in body:
        raise InvalidRequest("'input' is required")
    if body.get("previous_response_id"):
        raise InvalidRequest("llama.cpp does not support 'previous_response_id'.")
    chat = {key: value for key, value in body.items() if key not in RESPONSES_ONLY_FIELDS}
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": _text(body["instructions"],
                                                            "instructions")})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if not isinstance(item, dict):
                raise InvalidRequest("'input' items must be objects")
            _add_input_item(messages, item)
    else:
        raise InvalidRequest("'input' must be a string or array of objects")
    chat["messages"] = messages
    tools = _chat_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and text_format.get("type") in ("json_object",
                                                                     "json_schema"):
        chat.setdefault("response_format", {"type": text_format["type"],
                                            "schema": text_format.get("schema")})
    return chat


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"'{what}' must be a string")
    return value


def _add_input_item(messages: list[dict[str, Any]], item: dict[str, Any]) -> None:
    merge = bool(messages) and messages[-1].get("role") == "assistant"
    role, kind = item.get("role"), item.get("type")
    if isinstance(item.get("content"), str) and role in ("user", "system", "developer"):
        item = {**item, "content": [{"type": "input_text", "text": item["content"]}]}
    if isinstance(item.get("content"), list) and role in ("user", "system", "developer"):
        parts = [_input_part(part) for part in item["content"]]
        messages.append({"role": role, "content": parts})
    elif role == "assistant" and kind in ("message", None):
        parts = _output_parts(item.get("content"))
        if merge:
            previous = messages[-1]
            content = previous.get("content")
            if not isinstance(content, list):
                content = [] if content is None else [{"type": "text", "text": content}]
            previous["content"] = [*content, *parts]
        else:
            messages.append({"role": "assistant", "content": parts})
    elif kind == "function_call":
        for key in ("arguments", "call_id", "name"):
            _text(item.get(key), key)
        call = {"type": "function", "id": item["call_id"],
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        if merge:
            messages[-1].setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str | list):
            raise InvalidRequest("'output' of a function_call_output must be a string or array")
        content = output if isinstance(output, str) else [_input_part(p) for p in output]
        messages.append({"role": "tool", "tool_call_id": _text(item.get("call_id"), "call_id"),
                         "content": content})
    elif kind == "reasoning":
        content = item.get("content")
        if not (isinstance(content, list) and content and isinstance(content[0], dict)
                and isinstance(content[0].get("text"), str)):
            raise InvalidRequest("a reasoning item needs content[0].text")
        if merge:
            messages[-1]["reasoning_content"] = content[0]["text"]
        else:
            messages.append({"role": "assistant", "content": None,
                             "reasoning_content": content[0]["text"]})
    else:
        raise InvalidRequest("Cannot determine type of 'item'")


def _input_part(part: Any) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_text":
        return {"type": "text", "text": _text(part.get("text"), "text")}
    if kind == "input_image":
        if "image_url" not in part:
            raise InvalidRequest("'image_url' is required")
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    if kind == "input_file":
        raise InvalidRequest("'input_file' is not supported by llamacpp at this moment")
    raise InvalidRequest("'type' must be one of 'input_text', 'input_image', or 'input_file'")


def _output_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if content is None:
        return []
    if not isinstance(content, list):
        raise InvalidRequest("an assistant message's content must be a string or array")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("output_text", "input_text"):
            parts.append({"type": "text", "text": _text(part.get("text"), "text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _text(part.get("refusal"), "refusal")})
        else:
            raise InvalidRequest("'type' must be one of 'output_text' or 'refusal'")
    return parts


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    """Responses function tools ({type, name, parameters, …}) as chat tools; other tool
    types have no chat equivalent and are skipped, as llama-server does."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array of objects")
    converted = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            continue
        function = {key: value for key, value in tool.items() if key != "type"}
        function.setdefault("strict", True)
        converted.append({"type": "function", "function": function})
    return converted

"""Wire models of the Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) and
their conversion to the OpenAI-style chat messages that the chat template renders.

The conversion follows llama-server's `server_chat_convert_anthropic_to_oai`: the system prompt
becomes a system message, `tool_use` blocks become `tool_calls`, `tool_result` blocks become
`tool` messages after their message, `thinking` blocks become `reasoning_content`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from api.body import drop_nulls
from api.chat.messages import media_not_supported
from api.chat.request_tools import ToolChoice as OpenAIToolChoice
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.jobs import CompletionJob, parse_lora_request
from scheduler.contract.limits import ping_seconds
from scheduler.contract.sampling import SamplingParams

DEFAULT_MAX_TOKENS = 4096
DEFAULT_THINKING_BUDGET = 10000


class _Block(DeferredModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ImageBlock(_Block):
    type: Literal["image"]
    source: dict[str, Any] = Field(default_factory=dict)


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


ToolResultPart = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultPart] | None = None
    is_error: bool | None = None


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str = ""


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class MessageParam(_Block):
    """A turn; current Anthropic clients may also put system messages (text only) here."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]

    @model_validator(mode="after")
    def _system_is_text(self) -> MessageParam:
        if self.role == "system" and not isinstance(self.content, str) and any(
                not isinstance(block, TextBlock) for block in self.content):
            raise ValueError("a system message may only have text blocks")
        return self


class ToolParam(_Block):
    """A client tool; Anthropic's server tools (web search, bash, …) are not supported."""

    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None

    @model_validator(mode="after")
    def _schema_is_object(self) -> ToolParam:
        kind = self.input_schema.get("type", "object")
        if kind != "object":
            raise ValueError(f"input_schema of tool '{self.name}' must have type 'object', "
                             f"got {kind!r}")
        return self

    def to_openai(self) -> dict[str, Any]:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": self.input_schema}}


class ToolChoice(_Block):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs a 'name'")
        return self


class ThinkingConfig(_Block):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(default=None, ge=0)


class OutputFormat(_Block):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Block):
    """Structured output (`format`); `effort` is accepted and ignored."""

    format: OutputFormat | None = None
    effort: str | None = None


@dataclass
class ChatInput:
    """What the chat template and the output parser need, in OpenAI's shapes."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: OpenAIToolChoice = field(default_factory=OpenAIToolChoice)
    """"required" with a name for {"type": "tool"}, without one for {"type": "any"}."""
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_budget: int | None = None
    """The thinking budget in tokens ({"type": "enabled", "budget_tokens"}), else None."""


class MessagesRequest(_Block):
    """POST /v1/messages (and /v1/messages/count_tokens, where max_tokens is not needed).
    Unknown fields are ignored; known ones must have the right type. `model` may be absent,
    as in llama-server (the served model answers; a router asks for it by its own rule)."""

    model: str | None = None
    messages: list[MessageParam]
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    system: str | list[TextBlock] | None = None
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] = Field(default_factory=list)
    stream: bool = False
    sse_ping_interval: Annotated[float | None, AfterValidator(ping_seconds)] = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    lora: list[Any] | None = None
    """llama-server's per-request LoRA scales (its /v1/messages reads the field too)."""
    priority: int | None = None
    """Lower is served first (vLLM's field, ours; docs/fairness.md)."""

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return drop_nulls(data)

    @field_validator("lora", mode="before")
    @classmethod
    def _lora_is_an_array(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, list):
            raise ValueError("'lora' must be an array of objects with 'id' and 'scale' fields")
        return value

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> MessagesRequest:
        choice = self.tool_choice
        names = [tool.name for tool in self.tools or []]
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise ValueError(f"tool_choice of type '{choice.type}' needs tools")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise ValueError(f"tool_choice names tool '{choice.name}', which is not in tools")
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        return self

    def to_chat(self) -> ChatInput:
        messages = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.system_text()})
        for message in self.messages:
            messages.extend(convert_message(message))
        tools = [tool.to_openai() for tool in self.tools or []]
        choice = self.tool_choice
        parallel = not (choice is not None and choice.disable_parallel_tool_use)
        budget = None
        if self.thinking is not None and self.thinking.type == "enabled":
            budget = self.thinking.budget_tokens if self.thinking.budget_tokens is not None \
                else DEFAULT_THINKING_BUDGET
        return ChatInput(
            messages=messages, tools=tools, tool_choice=_openai_tool_choice(choice),
            parallel_tool_calls=parallel,
            chat_template_kwargs=dict(self.chat_template_kwargs or {}), reasoning_budget=budget)

    def system_text(self) -> str:
        if isinstance(self.system, str):
            return normalize_billing_header(self.system)
        return "".join(normalize_billing_header(block.text) for block in self.system or [])

    def output_schema(self) -> str | None:
        """The JSON schema of `output_config.format`, as JSON text."""
        if self.output_config is None or self.output_config.format is None:
            return None
        return json.dumps(self.output_config.format.schema_ or {"type": "object"})

    def to_job(self, model: str, prompt: str, *, json_schema: str | None = None
               ) -> CompletionJob:
        """The completion job of a rendered prompt; `json_schema` (a forced tool call's)
        replaces the one of `output_config.format`."""
        sampling = SamplingParams(temperature=self.temperature, top_p=self.top_p,
                                  top_k=self.top_k)
        return CompletionJob(
            model=model, prompt=prompt, stream=self.stream, n_predict=self.max_tokens,
            stop=list(self.stop_sequences), sampling=sampling,
            json_schema=json_schema or self.output_schema(),
            timings_per_token=self.stream,
            lora=parse_lora_request(self.lora) if self.lora else None, priority=self.priority)


def convert_message(message: MessageParam) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI messages: the message itself (unless only tool results
    were in it), then one `tool` message per tool_result block."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    tool_results: list[dict[str, Any]] = []
    reasoning = ""
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ThinkingBlock):
            reasoning += block.thinking
        elif isinstance(block, ImageBlock) and _is_media(block):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
        elif isinstance(block, ToolUseBlock):
            tool_calls.append({"id": block.id, "type": "function", "function": {
                "name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)}})
        elif isinstance(block, ToolResultBlock):
            tool_results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                 "content": _tool_result_text(block)})
    converted = []
    if parts or tool_calls or reasoning:
        out: dict[str, Any] = {"role": message.role, "content": parts or ""}
        if tool_calls:
            out["tool_calls"] = tool_calls
        if reasoning:
            out["reasoning_content"] = reasoning
        converted.append(out)
    return converted + tool_results


def _tool_result_text(block: ToolResultBlock) -> str:
    if block.content is None:
        return ""
    if isinstance(block.content, str):
        return block.content
    if any(isinstance(part, ImageBlock) and _is_media(part) for part in block.content):
        raise media_not_supported("image")
    return "".join(part.text for part in block.content if isinstance(part, TextBlock))


def _image_url(block: ImageBlock) -> str:
    """An image source as OpenAI's image_url (llama-server's conversion): base64 as a data
    URI, a URL as it is."""
    source = block.source
    if source.get("type") == "base64":
        media_type = source.get("media_type") or "image/jpeg"
        return f"data:{media_type};base64,{source.get('data') or ''}"
    return str(source.get("url") or "")


def _is_media(block: ImageBlock) -> bool:
    """An image llama-server passes on to the model (its other sources are dropped)."""
    return block.source.get("type") in ("base64", "url")


def _openai_tool_choice(choice: ToolChoice | None) -> OpenAIToolChoice:
    if choice is None or choice.type == "auto":
        return OpenAIToolChoice("auto")
    if choice.type == "none":
        return OpenAIToolChoice("none")
    return OpenAIToolChoice("required", choice.name if choice.type == "tool" else None)


_BILLING_PREFIX = "x-anthropic-billing-header:"
_CCH = re.compile(r"cch=[^;]{5};")


def normalize_billing_header(text: str) -> str:
    """Claude Code's system prompt starts with a billing header whose `cch=` stamp changes on
    every request and would defeat the prompt cache: pin it, as llama-server does."""
    if not text.startswith(_BILLING_PREFIX):
        return text
    return _CCH.sub("cch=fffff;", text, count=1)


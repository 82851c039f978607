"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

A request is converted to OpenAI-style chat messages (as llama-server does), rendered with the
model's chat template, run as a completion job, and its output parsed into thinking, text and
tool_use blocks. Errors keep the spec's `{"error": {"code", "message", "type"}}` shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from sanic import Blueprint, Request
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from api.chat.messages import validate_messages, validate_tools
from api.chat.parsing import ChatOutputParser, prompt_opens_thinking
from api.chat.reasoning import reasoning_spec
from api.chat.templates import ChatTemplate, template_kwargs
from api.chat.tool_grammar import add_system_hint, tool_call_grammar
from api.fleet import Fleet
from api.render_anthropic import (
    MessageStream,
    message_json,
    new_message_id,
    sse_error,
    sse_event,
)
from api.settings import ApiSettings
from api.streaming import Resume, StreamFormat, ping_interval, resume_of, stream_jobs
from api.wire.anthropic import ChatInput, MessagesRequest
from api.wire.body import parse_body
from scheduler.errors import InvalidRequest, Unavailable
from scheduler.jobs import CompletionJob, TokenizeJob
from scheduler.results import (
    CompletionResult,
    FinalEvent,
    TokenEvent,
    expect_result,
)

anthropic = Blueprint("anthropic")


@dataclass
class PreparedChat:
    """A request rendered for the model: the prompt and how to read the model's output."""

    chat: ChatInput
    template: ChatTemplate
    prompt: str
    json_schema: str | None = None
    """The schema a forced tool call must follow (tool_choice any/tool), as JSON text."""


def _settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.ctx.settings
    return settings


def _fleet(request: Request) -> Fleet:
    fleet: Fleet = request.app.ctx.fleet
    return fleet


@anthropic.post("/v1/messages")
async def messages(request: Request) -> HTTPResponse | None:
    body = parse_body(request, MessagesRequest)
    prepared = await _prepare(request, body)
    settings = _settings(request)
    job = body.to_job(settings.model_id(), prepared.prompt, json_schema=prepared.json_schema)
    budget = prepared.chat.reasoning_budget
    job.reasoning = reasoning_spec(
        prepared.template.source, prepared.prompt,
        settings.reasoning_budget if budget is None else budget,
        settings.reasoning_budget_message or "", armed=False)
    message_id = new_message_id()
    resume = None
    if body.stream:
        resume = await resume_of(request, _fleet(request), {"message_id": message_id})
        message_id = str(resume.record.minted["message_id"])
    stream = MessageStream(message_id, settings.model_id(), list(body.stop_sequences))
    parser = _parser(settings, prepared)
    if resume is not None:
        await _stream(request, job, parser, stream, resume, body.sse_ping_interval)
        return None
    result = await _fleet(request).jobs.run_completion(job)
    parser.feed(result.content)
    return json_response(message_json(stream.message_id, stream.model, result, parser.finish(),
                                      stream.stop_sequences))


@anthropic.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> HTTPResponse:
    body = parse_body(request, MessagesRequest)
    prepared = await _prepare(request, body)
    job = TokenizeJob(model=_settings(request).model_id(), content=prepared.prompt,
                      add_special=True, parse_special=True)
    result = await _fleet(request).jobs.tokenize(job)
    return json_response({"input_tokens": len(result.tokens)})


async def _prepare(request: Request, body: MessagesRequest) -> PreparedChat:
    """Validate the converted messages and tools, render the prompt (a final assistant message
    is continued under --prefill-assistant) and, when a tool call is forced, its schema."""
    settings = _settings(request)
    chat = body.to_chat()
    messages = validate_messages(chat.messages, allow_empty=True)
    tools = validate_tools(chat.tools)
    if tools and not settings.jinja:
        raise InvalidRequest("tools param requires --jinja flag")
    schema, hint = tool_call_grammar(tools, chat.tool_choice, chat.parallel_tool_calls)
    if schema is not None and body.output_schema() is not None:
        raise InvalidRequest("Cannot use output_config.format with a forced tool call")
    if hint is not None:
        messages = add_system_hint(messages, hint)
    workers = await _fleet(request).workers(settings.model_id())
    if not workers:
        raise Unavailable("Loading model")
    template = ChatTemplate.for_model(settings, workers[0].meta)
    prompt = template.render(
        messages, tools=tools or None,
        extra_context=template_kwargs(settings, chat.chat_template_kwargs),
        continue_final_message=None if settings.prefill_assistant else False,
        allow_empty=True)
    return PreparedChat(chat=chat, template=template, prompt=prompt, json_schema=schema)


def _parser(settings: ApiSettings, prepared: PreparedChat) -> ChatOutputParser:
    if settings.skip_chat_parsing:
        return ChatOutputParser(reasoning_format="none", tools=False)
    chat = prepared.chat
    tools = bool(chat.tools) and chat.tool_choice.mode != "none"
    return ChatOutputParser(
        reasoning_format=settings.reasoning_format, tools=tools,
        template_source=prepared.template.source,
        thinking_forced_open=prompt_opens_thinking(prepared.prompt, prepared.template.source),
        tool_names=[tool["function"]["name"] for tool in chat.tools] if tools else None)


async def _stream(request: Request, job: CompletionJob, parser: ChatOutputParser,
                  stream: MessageStream, resume: Resume, ping_field: float | None) -> None:
    """SSE with Anthropic's named events (api/streaming.py); an error after the stream started
    is an `error` event."""
    started = False

    def render(index: int, event: TokenEvent | FinalEvent) -> list[str]:
        nonlocal started
        out = []
        if not started:
            started = True
            out += stream.start(None if isinstance(event, FinalEvent) else event.timings)
        if isinstance(event, FinalEvent):
            out += stream.feed(parser.flush())
            out += stream.finish(expect_result(event.result, CompletionResult), parser.finish())
        elif event.content:
            out += stream.feed(parser.feed(event.content))
        return [sse_event(name, data) for name, data in out]

    await stream_jobs(request, _fleet(request), [job], resume,
                      StreamFormat(render, error=sse_error), ping_interval(request, ping_field))

"""The Anthropic Messages API: POST /v1/messages and /v1/messages/count_tokens.

A request is converted to OpenAI-style chat messages (as llama-server does), rendered with the
model's chat template, run as a completion job, and its output parsed into thinking, text and
tool_use blocks. Errors keep the spec's `{"error": {"code", "message", "type"}}` shape.
"""

from __future__ import annotations

import functools

from sanic import Request
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from api.body import parse_body
from api.chat.message import OutputParser
from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.endpoints.anthropic.protocol import MessagesRequest
from api.endpoints.anthropic.render import (
    MessageStream,
    message_json,
    new_message_id,
    sse_error,
    sse_event,
)
from api.fleet import Fleet
from api.media.refs import media_refs
from api.media.sources import media_access
from api.routing import Routes
from api.services import request_model, request_settings, services
from api.settings import ApiSettings
from api.streaming import (
    Resume,
    StreamFormat,
    early_comment,
    early_stream_errors,
    ping_interval,
    resume_of,
    stream_jobs,
)
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, TokenizeJob
from scheduler.contract.results import (
    CompletionResult,
    FinalEvent,
    TokenEvent,
    expect_result,
)

routes = Routes("anthropic")


def _settings(request: Request) -> ApiSettings:
    settings = request_settings(request)
    return settings


def _fleet(request: Request) -> Fleet:
    fleet = services(request).fleet
    return fleet


@routes.post("/v1/messages", body=MessagesRequest)
@functools.partial(early_stream_errors, fmt=sse_error)  # after a cold start: its `error` event
async def messages(request: Request) -> HTTPResponse | None:
    body = parse_body(request, MessagesRequest)
    prepared = await _prepare(request, body, stream=bool(body.stream))
    job = body.to_job(request_model(request), prepared.prompt, json_schema=prepared.tool_schema)
    if prepared.media is not None:
        job.media = await media_refs(prepared.media.sources, media_access(_settings(request)),
                                     services(request).store)
        job.media_marker = prepared.media.marker
    prepared.fill(job)
    message_id = new_message_id()
    resume = None
    if body.stream:
        resume = await resume_of(request, _fleet(request), {"message_id": message_id})
        message_id = str(resume.record.minted["message_id"])
    stream = MessageStream(message_id, request_model(request), list(body.stop_sequences))
    parser = prepared.parser()
    if resume is not None:
        await _stream(request, job, parser, stream, resume, body.sse_ping_interval)
        return None
    result = await _fleet(request).jobs.run_completion(job)
    parser.feed(result.content)
    return json_response(message_json(stream.message_id, stream.model, result, parser.finish(),
                                      stream.stop_sequences))


@routes.post("/v1/messages/count_tokens", body=MessagesRequest)
async def count_tokens(request: Request) -> HTTPResponse:
    body = parse_body(request, MessagesRequest)
    prepared = await _prepare(request, body)
    job = TokenizeJob(model=request_model(request), content=prepared.prompt,
                      add_special=True, parse_special=True)
    result = await _fleet(request).jobs.tokenize(job)
    return json_response({"input_tokens": len(result.tokens)})


async def _prepare(request: Request, body: MessagesRequest,
                   stream: bool = False) -> PreparedChat:
    """The chat preparation every chat API shares (api/chat/prepare.py), from the converted
    messages and tools: none at all renders too, a final assistant message is continued under
    --prefill-assistant, and a forced tool call cannot also have `output_config.format`. A
    `stream` held for a cold start opens early, with waiting comments (api/cold_start.py)."""
    settings = _settings(request)
    chat = body.to_chat()
    tick = (lambda: early_comment(request)) if stream else None
    workers = await _fleet(request).placement.workers(request_model(request), wait=True,
                                                      tick=tick)
    prepared = prepare_chat(settings, workers[0].meta, ChatRequest(
        messages=chat.messages, tools=chat.tools, tool_choice=chat.tool_choice,
        parallel_tool_calls=chat.parallel_tool_calls,
        chat_template_kwargs=chat.chat_template_kwargs, allow_empty=True,
        reasoning_budget=chat.reasoning_budget))
    if prepared.tool_schema is not None and body.output_schema() is not None:
        raise InvalidRequest("Cannot use output_config.format with a forced tool call")
    return prepared


async def _stream(request: Request, job: CompletionJob, parser: OutputParser,
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

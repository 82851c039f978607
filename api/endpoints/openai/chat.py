"""/v1/chat/completions: messages → chat template → jobs → output parsing (content, reasoning,
tool calls) → chat.completion objects or chunks. Also its token counting and control
endpoints; the Responses API (responses.py) runs on the same plan."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import json_body, parse_body
from api.chat.message import ChatMessage, OutputParser
from api.chat.prepare import ChatRequest, PreparedChat, prepare_chat
from api.endpoints.native.render import completion_json
from api.endpoints.openai.context import OpenAIContext
from api.endpoints.openai.protocol import ChatCompletionRequest, ControlRequest, responses_to_chat
from api.endpoints.openai.render import (
    ROLE_DELTA,
    Envelope,
    chat_chunk_json,
    chat_completion_json,
    chat_usage_chunk_json,
    delta_json,
    finish_reason,
    logprobs_json,
    timings_json,
)
from api.errors import validation_message
from api.media.refs import media_refs
from api.media.sources import media_access
from api.sse import sse_data
from api.streaming import early_stream_errors
from api.tenants.config import DEFAULT_TENANT
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, TokenizeJob
from scheduler.contract.media import MediaRef
from scheduler.contract.results import (
    CompletionResult,
    FinalEvent,
    TokenEvent,
    expect_result,
)

log = logging.getLogger(__name__)


@dataclass
class ChatPlan:
    """A chat completion made ready to run: the request and its prepared chat."""

    body: ChatCompletionRequest
    prepared: PreparedChat
    media: list[MediaRef] = field(default_factory=list)
    """The messages' media, read (api/media/), in the order of the prompt's markers."""

    @property
    def prompt(self) -> str:
        return self.prepared.prompt

    def jobs(self, model_id: str) -> list[CompletionJob]:
        jobs = self.body.chat_jobs(model_id, self.prepared.prompt, self.prepared.tool_schema)
        for job in jobs:
            self.prepared.fill(job)
            if self.media and self.prepared.media is not None:
                job.media = self.media
                job.media_marker = self.prepared.media.marker
        return jobs

    def parser(self) -> OutputParser:
        return self.prepared.parser()

    def parse(self, text: str) -> ChatMessage:
        return self.prepared.parse(text)


def _json_response(body: ChatCompletionRequest) -> bool:
    """Whether the answer is held to a JSON schema (a conflict is reported with the job)."""
    try:
        return body.schema_text() is not None
    except InvalidRequest:
        return False


async def plan_chat(context: OpenAIContext, body: ChatCompletionRequest,
                    stream: bool = False) -> ChatPlan:
    """The chat preparation every chat API shares (api/chat/prepare.py), from this body
    (`stream`: a cold start's wait opens the stream early, api/cold_start.py)."""
    workers = await context.workers(stream)
    budget = next((b for b in (body.reasoning_budget_tokens, body.thinking_budget_tokens)
                   if b is not None), None)
    prepared = prepare_chat(context.settings, workers[0].meta, ChatRequest(
        messages=body.messages, tools=body.tools,
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls,
        chat_template_kwargs=body.chat_template_kwargs,
        reasoning_effort=body.reasoning_effort,
        add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        reasoning_format=body.reasoning_format, reasoning_budget=budget,
        reasoning_budget_message=body.reasoning_budget_message,
        reasoning_control=body.reasoning_control, json_response=_json_response(body)))
    log.debug("chat prompt: %s template, %d characters, tools %d (%s)",
              prepared.template.name, len(prepared.prompt), len(prepared.tools),
              prepared.tool_choice.mode)
    media = [] if prepared.media is None else await media_refs(
        prepared.media.sources, media_access(context.settings), context.store)
    return ChatPlan(body, prepared, media)


Model = TypeVar("Model", bound=BaseModel)


def validate_as(model: type[Model], data: dict[str, Any]) -> Model:
    """A body built by conversion (Responses → chat), checked like a parsed one."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None


# /v1/chat/completions/control


async def control(request: Request) -> HTTPResponse:
    """Ends the thinking block of a running completion. An unknown or finished id (or one not
    armed with reasoning_control) is a no-op answered with success false."""
    body = parse_body(request, ControlRequest)
    caller = request.ctx.tenant  # another tenant's completion is as an unknown one
    if not await OpenAIContext.of(request).fleet.jobs.end_reasoning(
            body.id, lambda owner: caller.owns(owner or DEFAULT_TENANT)):
        return json({"success": False,
                     "message": "no active completion with reasoning_control for this id"})
    return json({"success": True})


# /v1/chat/completions


@early_stream_errors
async def chat_completions(request: Request) -> HTTPResponse | None:
    context = OpenAIContext.of(request)
    body = parse_body(request, ChatCompletionRequest)
    plan = await plan_chat(context, body, stream=bool(body.stream))
    jobs = plan.jobs(context.model_id)
    await context.prepare(jobs, body.id_slot, body.choices)
    envelope = await context.envelope("chatcmpl-", body.stream)
    verbose = context.verbose(body.verbose)
    offsets = await context.slot_offsets() if verbose else None
    context.adopt_resumed(jobs)
    async with context.fleet.jobs.controllable(envelope.id, jobs, body.reasoning_control,
                                               request.ctx.tenant.name):
        if not body.stream:
            return json(await chat_completion(context, plan, jobs, envelope, offsets))
        stream = ChatStream(plan, envelope, jobs, offsets)
        await context.stream(jobs, stream.render, stream.end,
                             ping_field=body.sse_ping_interval)
        return None


async def chat_completion(context: OpenAIContext, plan: ChatPlan, jobs: list[CompletionJob],
                          envelope: Envelope, offsets: dict[str, int] | None
                          ) -> dict[str, Any]:
    """The chat.completion object of a request that does not stream (and of a batch line);
    `offsets` (the workers' slot offsets) asks for `__verbose`."""
    results = await context.run(jobs)
    choices = [(i, result, plan.parse(result.content)) for i, result in enumerate(results)]
    out = chat_completion_json(envelope, choices)
    if offsets is not None:
        out["__verbose"] = completion_json(results[0], 0, offsets.get(results[0].worker_id, 0))
    return out


async def batch_chat_completion(context: OpenAIContext, data: dict[str, Any]
                                ) -> dict[str, Any]:
    """One line of a /v1/chat/completions batch: the body a request without `stream` gets."""
    body = validate_as(ChatCompletionRequest, data)
    if body.stream:
        raise InvalidRequest("stream is not supported in a batch")
    if body.reasoning_control:
        raise InvalidRequest("reasoning_control is not supported in a batch")
    plan = await plan_chat(context, body)
    jobs = plan.jobs(context.model_id)
    await context.prepare(jobs, body.id_slot, body.choices)
    envelope = await context.envelope("chatcmpl-", False)
    offsets = await context.slot_offsets() if context.verbose(body.verbose) else None
    return await chat_completion(context, plan, jobs, envelope, offsets)


class ChatStream:
    """chat.completion.chunk events of the choices: a role chunk first, then a chunk per parsed
    delta (logprobs on the last one of a token), a finish chunk per choice, and with
    `stream_options.include_usage` a last chunk with usage and no choices."""

    def __init__(self, plan: ChatPlan, envelope: Envelope, jobs: list[CompletionJob],
                 verbose_offsets: dict[str, int] | None = None) -> None:
        """`verbose_offsets` (the workers' slot offsets) asks for `__verbose` objects."""
        self.envelope = envelope
        self.verbose_offsets = verbose_offsets
        self.include_usage = plan.body.include_usage
        self.parsers = [plan.parser() for _ in jobs]
        self.started = [False] * len(jobs)
        self.results: dict[int, CompletionResult] = {}

    def render(self, index: int, event: TokenEvent | FinalEvent) -> Iterable[str]:
        if isinstance(event, TokenEvent) and event.progress is not None:
            # llama-server: each prompt-progress chunk is a role delta, and the first token
            # still gets its own role chunk after them
            chunk = chat_chunk_json(self.envelope, index, dict(ROLE_DELTA))
            chunk["prompt_progress"] = event.progress.model_dump()
            if event.timings is not None:
                chunk["timings"] = event.timings.model_dump()
            return [sse_data(chunk)]
        chunks = []
        if not self.started[index]:
            self.started[index] = True
            chunks.append(chat_chunk_json(self.envelope, index, dict(ROLE_DELTA)))
        parser = self.parsers[index]
        if isinstance(event, FinalEvent):
            result = expect_result(event.result, CompletionResult)
            first = len(chunks)
            deltas = parser.feed(result.content) + parser.flush()
            chunks.extend(self._deltas(index, deltas))
            message = parser.finish()
            finish = chat_chunk_json(self.envelope, index, {},
                                     finish_reason(result, bool(message.tool_calls)))
            if not self.include_usage:
                finish["timings"] = timings_json(result)
            chunks.append(finish)
            if self.verbose_offsets is not None:  # on the first chunk of the final result
                chunks[first]["__verbose"] = completion_json(
                    result, index, self.verbose_offsets.get(result.worker_id, 0))
            self.results[index] = result
        else:
            delta_chunks = self._deltas(index, parser.feed(event.content))
            if delta_chunks and event.probs:
                delta_chunks[-1]["choices"][0]["logprobs"] = logprobs_json(
                    event.probs, event.post_sampling_probs)
            chunks.extend(delta_chunks)
            if event.timings is not None and chunks:
                chunks[-1]["timings"] = event.timings.model_dump()
        return [sse_data(chunk) for chunk in chunks]

    def _deltas(self, index: int, deltas: Iterable[Any]) -> list[dict[str, Any]]:
        rendered = (delta_json(delta) for delta in deltas)
        return [chat_chunk_json(self.envelope, index, delta) for delta in rendered if delta]

    def end(self) -> Iterable[str]:
        if not self.include_usage or not self.results:
            return []
        results = [self.results[i] for i in sorted(self.results)]
        chunk = chat_usage_chunk_json(self.envelope, results)
        chunk["timings"] = timings_json(results[0])
        return [sse_data(chunk)]


# token counting


async def count_prompt_tokens(context: OpenAIContext, body: ChatCompletionRequest
                              ) -> HTTPResponse:
    plan = await plan_chat(context, body)
    job = TokenizeJob(model=context.model_id, content=plan.prompt, add_special=True,
                      parse_special=True)
    result = await context.fleet.jobs.tokenize(job)
    return json({"object": "response.input_tokens", "input_tokens": len(result.tokens)})


async def chat_input_tokens(request: Request) -> HTTPResponse:
    return await count_prompt_tokens(OpenAIContext.of(request),
                                     parse_body(request, ChatCompletionRequest))


async def responses_input_tokens(request: Request) -> HTTPResponse:
    body = validate_as(ChatCompletionRequest, responses_to_chat(json_body(request)))
    return await count_prompt_tokens(OpenAIContext.of(request), body)

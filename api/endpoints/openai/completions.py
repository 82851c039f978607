"""/v1/completions: a prompt (or several) → jobs → text_completion objects or chunks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.endpoints.native.render import completion_json, verbose_partial_json
from api.endpoints.openai.chat import validate_as
from api.endpoints.openai.context import OpenAIContext
from api.endpoints.openai.protocol import OpenAICompletionRequest
from api.endpoints.openai.render import (
    Envelope,
    logprobs_json,
    text_chunk_json,
    text_completion_json,
    text_final_chunk_json,
)
from api.sse import sse_data
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import CompletionResult, FinalEvent, TokenEvent, expect_result


async def completions(request: Request) -> HTTPResponse | None:
    context = OpenAIContext.of(request)
    body = parse_body(request, OpenAICompletionRequest)
    jobs = body.to_jobs(context.model_id)
    await context.prepare(jobs, body.id_slot, body.choices)
    envelope = await context.envelope("cmpl-", body.stream)
    verbose = context.verbose(body.verbose)
    offsets = await context.slot_offsets() if verbose else {}
    if not body.stream:
        return json(await text_completion(context, body, jobs, envelope, verbose, offsets))

    def render(index: int, event: TokenEvent | FinalEvent) -> Iterable[str]:
        if isinstance(event, FinalEvent):
            result = expect_result(event.result, CompletionResult)
            final = text_final_chunk_json(envelope, index, result)
            if verbose:
                final["__verbose"] = completion_json(
                    result, index, offsets.get(result.worker_id, 0))
            return [sse_data(final)]
        post_sampling = event.post_sampling_probs
        chunk = text_chunk_json(envelope, index, event.content,
                                logprobs_json(event.probs, post_sampling))
        if verbose:
            chunk["__verbose"] = verbose_partial_json(event, index, post_sampling)
        if event.timings is not None:
            chunk["timings"] = event.timings.model_dump()
        if event.progress is not None:
            chunk["prompt_progress"] = event.progress.model_dump()
        return [sse_data(chunk)]

    await context.stream(jobs, render, ping_field=body.sse_ping_interval)
    return None


async def text_completion(context: OpenAIContext, body: OpenAICompletionRequest,
                          jobs: list[CompletionJob], envelope: Envelope, verbose: bool,
                          offsets: dict[str, int]) -> dict[str, Any]:
    """The text_completion object of a request that does not stream (and of a batch line)."""
    results = await context.run(jobs)
    out = text_completion_json(envelope, results, body.choices)
    if verbose:
        out["__verbose"] = completion_json(results[0], 0, offsets.get(results[0].worker_id, 0))
    return out


async def batch_completion(context: OpenAIContext, data: dict[str, Any]) -> dict[str, Any]:
    """One line of a /v1/completions batch: the body a request without `stream` gets."""
    body = validate_as(OpenAICompletionRequest, data)
    if body.stream:
        raise InvalidRequest("stream is not supported in a batch")
    jobs = body.to_jobs(context.model_id)
    await context.prepare(jobs, body.id_slot, body.choices)
    envelope = await context.envelope("cmpl-", False)
    verbose = context.verbose(body.verbose)
    offsets = await context.slot_offsets() if verbose else {}
    return await text_completion(context, body, jobs, envelope, verbose, offsets)

"""/v1/responses: the Responses API, converted to a chat completion (as llama-server does) and
answered as a `response` object or a stream of Responses events."""

from __future__ import annotations

from collections.abc import Iterable

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import json_body
from api.endpoints.openai.chat import plan_chat, validate_as
from api.endpoints.openai.context import OpenAIContext
from api.endpoints.openai.protocol import ChatCompletionRequest, responses_to_chat
from api.endpoints.openai.render import ResponseEvents, response_json, sse_event, timings_json
from api.streaming import early_stream_errors
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.results import CompletionResult, FinalEvent, TokenEvent, expect_result


@early_stream_errors
async def responses(request: Request) -> HTTPResponse | None:
    context = OpenAIContext.of(request)
    body = validate_as(ChatCompletionRequest, responses_to_chat(json_body(request)))
    if body.choices != 1:
        raise InvalidRequest("the Responses API makes one answer per request")
    plan = await plan_chat(context, body, stream=bool(body.stream))
    jobs = plan.jobs(context.model_id)
    await context.prepare(jobs, body.id_slot, 1)
    envelope = await context.envelope("resp_", body.stream)
    if not body.stream:
        (result,) = await context.run(jobs)
        return json(response_json(envelope, plan.parse(result.content), [result]))

    events = ResponseEvents(envelope)
    parser = plan.parser()
    started = False

    def render(index: int, event: TokenEvent | FinalEvent) -> Iterable[str]:
        nonlocal started
        out = []
        if not started:
            started = True
            out.extend(events.start())
        if isinstance(event, FinalEvent):
            result = expect_result(event.result, CompletionResult)
            held = len(out)
            for delta in parser.feed(result.content) + parser.flush():
                out.extend(events.delta(delta))
            if len(out) > held and body.timings_per_token:  # text the parser held till the
                out[-1][1]["timings"] = timings_json(result)  # end: its chunk's last event
            out.extend(events.finish(parser.finish(), [result]))
            return [sse_event(item) for item in out]
        if event.progress is not None and len(out) == 0:
            out.append(events.in_progress())
        for delta in parser.feed(event.content):
            out.extend(events.delta(delta))
        if out:  # llama-server puts timings and progress on a chunk's last event
            data = out[-1][1]
            if event.timings is not None:
                data["timings"] = event.timings.model_dump()
            if event.progress is not None:
                data["prompt_progress"] = event.progress.model_dump()
        return [sse_event(item) for item in out]

    await context.stream(jobs, render, terminator="", ping_field=body.sse_ping_interval)
    return None

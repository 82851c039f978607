"""llama-server's native endpoints: health, models, completion, tokenize, detokenize."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.endpoints.models.api_router import router_models
from api.endpoints.native.protocol import (
    CompletionRequest,
    DetokenizeRequest,
    InfillRequest,
    TokenizeRequest,
)
from api.endpoints.native.render import completion_json, model_card, ollama_model_json, partial_json
from api.fleet import Fleet
from api.router import request_model
from api.settings import ApiSettings
from api.sse import sse_data
from api.streaming import StreamFormat, ping_interval, resume_of, stream_jobs
from scheduler import limits
from scheduler.decision_meta import file_output_modalities
from scheduler.errors import InvalidRequest, Unavailable
from scheduler.jobs import CompletionJob
from scheduler.registry import least_loaded
from scheduler.results import (
    CompletionResult,
    FinalEvent,
    TokenEvent,
    expect_result,
)
from scheduler.slot_ids import locate_slot, slot_offset

native = Blueprint("native")
Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def route(methods: list[str], *paths: str) -> Callable[[Handler], Handler]:
    """Register a handler under several paths (llama-server has many aliases)."""

    def register(handler: Handler) -> Handler:
        for path in paths:
            native.add_route(handler, path,  # type: ignore[arg-type]
                             methods=methods,
                             name=f"{handler.__name__}{path.replace('/', '_').replace('.', '_')}")
        return handler

    return register


def _fleet(request: Request) -> Fleet:
    fleet: Fleet = request.app.ctx.fleet
    return fleet


def _model_id(request: Request) -> str:
    return request_model(request)


@route(["GET"], "/health", "/v1/health")
async def health(request: Request) -> HTTPResponse:
    if request.app.ctx.router is not None:  # a router is healthy without any model loaded
        return json({"status": "ok"})
    if not await _fleet(request).workers(_model_id(request), fresh=True):
        raise Unavailable("Loading model")
    return json({"status": "ok"})


@route(["GET"], "/models", "/v1/models")
async def models(request: Request) -> HTTPResponse:
    if request.app.ctx.router is not None:
        return await router_models(request)
    model_id = _model_id(request)
    workers = await _fleet(request).workers(model_id)
    worker = workers[0] if workers else None
    settings: ApiSettings = request.app.ctx.settings
    card = model_card(model_id, int(request.app.ctx.started_at),
                      worker.meta if worker else None, worker.n_ctx_slot if worker else None,
                      aliases=settings.alias, tags=settings.tags,
                      offline_modalities=None if worker else await _offline_modalities(request))
    capabilities = worker.capabilities() if worker else ["completion"]
    card["capabilities"] = capabilities  # ours: what the model serves
    return json({"models": [ollama_model_json(model_id, capabilities)], "object": "list",
                 "data": [card]})


async def _offline_modalities(request: Request) -> list[str]:
    """The model file's output modalities from its GGUF header, when the file is here (a
    native decision model shows "decisions" before any worker loaded it); read once per file
    version."""
    settings: ApiSettings = request.app.ctx.settings
    path = Path(settings.model) if settings.model else None
    if path is None or not path.is_file():
        return ["text"]
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    cache: dict[tuple[str, int, int], list[str]] = request.app.ctx.__dict__.setdefault(
        "offline_modalities", {})
    if key not in cache:
        cache[key] = await asyncio.to_thread(file_output_modalities, path)
    return cache[key]


@route(["POST"], "/tokenize")
async def tokenize(request: Request) -> HTTPResponse:
    job = parse_body(request, TokenizeRequest).to_job(_model_id(request))
    result = await _fleet(request).jobs.tokenize(job)
    return json(result.model_dump(exclude={"result_kind"}))


@route(["POST"], "/detokenize")
async def detokenize(request: Request) -> HTTPResponse:
    job = parse_body(request, DetokenizeRequest).to_job(_model_id(request))
    result = await _fleet(request).jobs.detokenize(job)
    return json({"content": result.content})


@route(["POST"], "/completion", "/completions")
async def completion(request: Request) -> HTTPResponse | None:
    return await _complete(request, parse_body(request, CompletionRequest))


@route(["POST"], "/infill")
async def infill(request: Request) -> HTTPResponse | None:
    return await _complete(request, parse_body(request, InfillRequest))


async def _complete(request: Request, body: CompletionRequest) -> HTTPResponse | None:
    jobs = body.to_jobs(_model_id(request))
    if body.n_cmpl > 1 and body.id_slot < 0:
        await _keep_completions_together(request, jobs, body.n_cmpl)
    if body.id_slot >= 0:
        await _route_to_slot(request, jobs, body.id_slot, body.n_cmpl)
    if body.stream:
        await _stream(request, body, jobs)
        return None
    results = await asyncio.gather(*(_fleet(request).jobs.run_completion(job) for job in jobs))
    rendered = [await _render(request, r, i, body.response_fields)
                for i, r in enumerate(results)]
    return json(rendered[0] if len(rendered) == 1 else rendered)


async def _keep_completions_together(request: Request, jobs: list[CompletionJob],
                                     n_cmpl: int) -> None:
    """The n_cmpl completions of one prompt run on one worker (its queue), so they share its
    prompt cache; more than that worker's slots is a 400, as in llama-server."""
    fleet = _fleet(request)
    workers = await fleet.workers(_model_id(request))
    if not workers:
        raise Unavailable("Loading model")
    loads = await fleet.registry.loads(workers)
    for first in range(0, len(jobs), n_cmpl):
        worker = least_loaded(workers, loads, n_cmpl)
        if n_cmpl > worker.n_slots:
            raise InvalidRequest(
                f"n_cmpl ({n_cmpl}) exceeds the number of slots ({worker.n_slots})")
        for job in jobs[first : first + n_cmpl]:
            job.worker_id = worker.worker_id


async def _route_to_slot(request: Request, jobs: list[CompletionJob], id_slot: int,
                         n_cmpl: int) -> None:
    worker, local_id = locate_slot(await _fleet(request).workers(_model_id(request)), id_slot)
    limits.check_fan_out(1, n_cmpl, worker.n_slots)  # the worker that holds the slot runs all
    for job in jobs:
        job.worker_id = worker.worker_id
        job.id_slot = local_id


async def _render(request: Request, result: CompletionResult, index: int,
                  response_fields: list[str] | None = None) -> dict[str, Any]:
    workers = await _fleet(request).workers(_model_id(request))
    return completion_json(result, index, slot_offset(workers, result.worker_id),
                           response_fields)


async def _stream(request: Request, body: CompletionRequest, jobs: list[CompletionJob]) -> None:
    """SSE: one `data:` event per token, then the final one (api/streaming.py)."""
    multiple = len(jobs) > 1
    resume = await resume_of(request, _fleet(request))

    async def render(index: int, event: TokenEvent | FinalEvent) -> list[str]:
        if isinstance(event, FinalEvent):
            result = expect_result(event.result, CompletionResult)
            return [sse_data(await _render(request, result, index, body.response_fields))]
        return [sse_data(partial_json(event, index if multiple else None,
                                      jobs[index].post_sampling_probs))]

    await stream_jobs(request, _fleet(request), jobs, resume, StreamFormat(render),
                      ping_interval(request, body.sse_ping_interval))

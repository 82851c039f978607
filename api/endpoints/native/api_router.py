"""llama-server's native endpoints: health, models, completion, tokenize, detokenize."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sanic import Request
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
from api.media.prompts import attach_prompt_media
from api.routing import Routes
from api.services import request_model, request_settings, services
from api.sse import sse_data
from api.streaming import StreamFormat, ping_interval, resume_of, stream_jobs
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import (
    CompletionResult,
    FinalEvent,
    TokenEvent,
    expect_result,
)
from scheduler.decision_meta import file_output_modalities
from scheduler.slot_ids import slot_offset

routes = Routes("native")


def _fleet(request: Request) -> Fleet:
    return services(request).fleet


def _model_id(request: Request) -> str:
    return request_model(request)


@routes.get("/health", "/v1/health")
async def health(request: Request) -> HTTPResponse:
    if services(request).router is not None:  # a router is healthy without any model loaded
        return json({"status": "ok"})
    await _fleet(request).placement.workers(_model_id(request), fresh=True)
    return json({"status": "ok"})


@routes.get("/models", "/v1/models")
async def models(request: Request) -> HTTPResponse:
    if services(request).router is not None:
        return await router_models(request)
    model_id = _model_id(request)
    workers = await _fleet(request).workers(model_id)
    worker = workers[0] if workers else None
    settings = request_settings(request)
    card = model_card(model_id, int(services(request).started_at),
                      worker.meta if worker else None, worker.n_ctx_slot if worker else None,
                      aliases=settings.alias, tags=settings.tags,
                      offline_modalities=None if worker else await _offline_modalities(request))
    capabilities = worker.capabilities() if worker else ["completion"]
    if worker is not None and worker.meta.takes_media():
        capabilities = [*capabilities, "multimodal"]  # llama-server's, with a projector
    card["capabilities"] = capabilities  # ours: what the model serves
    return json({"models": [ollama_model_json(model_id, capabilities)], "object": "list",
                 "data": [card]})


async def _offline_modalities(request: Request) -> list[str]:
    """The model file's output modalities from its GGUF header, when the file is here (a
    native decision model shows "decisions" before any worker loaded it); read once per file
    version."""
    settings = request_settings(request)
    path = Path(settings.model) if settings.model else None
    if path is None or not path.is_file():
        return ["text"]
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    cache = services(request).offline_modalities
    if key not in cache:
        cache[key] = await asyncio.to_thread(file_output_modalities, path)
    return cache[key]


@routes.post("/tokenize", body=TokenizeRequest)
async def tokenize(request: Request) -> HTTPResponse:
    job = parse_body(request, TokenizeRequest).to_job(_model_id(request))
    result = await _fleet(request).jobs.tokenize(job)
    return json(result.model_dump(exclude={"result_kind"}))


@routes.post("/detokenize", body=DetokenizeRequest)
async def detokenize(request: Request) -> HTTPResponse:
    job = parse_body(request, DetokenizeRequest).to_job(_model_id(request))
    result = await _fleet(request).jobs.detokenize(job)
    return json({"content": result.content})


@routes.post("/completion", "/completions", body=CompletionRequest)
async def completion(request: Request) -> HTTPResponse | None:
    return await _complete(request, parse_body(request, CompletionRequest))


@routes.post("/infill", body=InfillRequest)
async def infill(request: Request) -> HTTPResponse | None:
    return await _complete(request, parse_body(request, InfillRequest))


async def _complete(request: Request, body: CompletionRequest) -> HTTPResponse | None:
    jobs = body.to_jobs(_model_id(request))
    media = body.prompt_media()
    if any(media):  # /infill's prompt is a string: it takes none
        workers = await _fleet(request).workers(_model_id(request))
        await attach_prompt_media(jobs, media, body.n_cmpl, workers[0].meta if workers else None,
                                  services(request).store)
    await _fleet(request).placement.pin(_model_id(request), jobs, choices=body.n_cmpl,
                                        id_slot=body.id_slot, field="n_cmpl", together=True)
    if body.stream:
        await _stream(request, body, jobs)
        return None
    results = await asyncio.gather(*(_fleet(request).jobs.run_completion(job) for job in jobs))
    rendered = [await _render(request, r, i, body.response_fields)
                for i, r in enumerate(results)]
    return json(rendered[0] if len(rendered) == 1 else rendered)


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
                                      event.post_sampling_probs))]

    await stream_jobs(request, _fleet(request), jobs, resume, StreamFormat(render),
                      ping_interval(request, body.sse_ping_interval))

"""The lines of a /v1/embeddings batch chunk, run as few jobs: every input of every line of the
chunk goes into one background EmbeddingJob (one per embd_normalize value) with per-input errors,
so a chunk fills a worker's decode and a bad input fails only its own line. Each line is read
and answered as /v1/embeddings reads and answers it (api/endpoints/embeddings/protocol.py,
api/endpoints/embeddings/render.py)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from api.batch.input import BatchLine
from api.batch.lines import RETRIES, RETRY_PAUSE_S, LineResult, failed_line, output_line
from api.endpoints.embeddings.protocol import EmbeddingsRequest
from api.endpoints.embeddings.render import native_embeddings_json, oai_embeddings_json
from api.endpoints.openai.context import OpenAIContext
from api.media.embeddings import has_media, resolve_inputs
from api.media.sources import media_access
from api.placement import NO_EMBEDDINGS
from scheduler.contract.errors import (
    InvalidRequest,
    LlamaqError,
    NotSupported,
    ServerError,
    Unavailable,
)
from scheduler.contract.jobs import EmbeddingInput, EmbeddingJob
from scheduler.contract.results import EmbeddingItem, EmbeddingResult
from scheduler.registry import ModelMeta

log = logging.getLogger(__name__)

MAX_JOB_INPUTS = 512
"""Inputs of one chunk job (lines with many inputs make several jobs)."""


@dataclass
class EmbeddingLine:
    line: BatchLine
    request: EmbeddingsRequest
    inputs: list[EmbeddingInput]
    """The request's inputs with their media read (api/media/embeddings.py)."""


def render(parsed: EmbeddingLine, pooling: Any, items: list[EmbeddingItem],
           model_id: str) -> Any:
    """The line's body: what /v1/embeddings answers for its inputs alone."""
    result = EmbeddingResult(pooling=pooling, items=[
        item.model_copy(update={"index": i}) for i, item in enumerate(items)])
    if not parsed.request.answers_oai(oai_route=True):
        return native_embeddings_json(result)
    model = parsed.request.model if isinstance(parsed.request.model, str) else model_id
    return oai_embeddings_json(result, model, parsed.request.base64)


async def _refusal(context: OpenAIContext) -> tuple[LlamaqError | None, ModelMeta | None]:
    """Why no line of this chunk can run (as /v1/embeddings answers), if so; and the model as
    its embedding workers report it (its projector, for lines with media)."""
    workers = await context.fleet.workers(context.model_id)
    embedders = [w for w in workers if "embedding" in w.capabilities()]
    meta = embedders[0].meta if embedders else None
    if workers and not embedders:
        return NotSupported(NO_EMBEDDINGS), meta
    if any(w.pooling == "none" for w in embedders):
        return InvalidRequest("Pooling type 'none' is not OAI compatible. Please use a "
                              "different pooling type"), meta
    return None, meta


async def _read_line(context: OpenAIContext, line: BatchLine,
                     meta: ModelMeta | None) -> EmbeddingLine:
    request = EmbeddingsRequest.model_validate(line.body)  # an object: api/batch/input.py
    inputs = request.to_job(context.model_id, None).inputs if not has_media(request.inputs) \
        else await resolve_inputs(request.inputs, meta, context.store,
                                media_access(context.settings))
    return EmbeddingLine(line, request, inputs)


async def run_embedding_chunk(context: OpenAIContext, lines: list[BatchLine]
                              ) -> list[LineResult]:
    results: dict[int, LineResult] = {}
    groups: dict[int | None, list[tuple[int, EmbeddingLine]]] = {}
    refusal, meta = await _refusal(context)
    for position, line in enumerate(lines):
        try:
            if refusal is not None:
                raise refusal
            parsed = await _read_line(context, line, meta)
        except LlamaqError as error:
            results[position] = failed_line(line, error)
            continue
        groups.setdefault(parsed.request.embd_normalize, []).append((position, parsed))
    for normalize, group in groups.items():
        for members in _jobs_of(group):
            await _run_job(context, normalize, members, results)
    return [results[i] for i in range(len(lines))]


def _jobs_of(group: list[tuple[int, EmbeddingLine]]) -> list[list[tuple[int, EmbeddingLine]]]:
    """Lines into jobs of at most MAX_JOB_INPUTS inputs (a line is never split)."""
    jobs: list[list[tuple[int, EmbeddingLine]]] = [[]]
    size = 0
    for member in group:
        n = len(member[1].request.inputs)
        if jobs[-1] and size + n > MAX_JOB_INPUTS:
            jobs.append([])
            size = 0
        jobs[-1].append(member)
        size += n
    return jobs


async def _run_job(context: OpenAIContext, normalize: int | None,
                   members: list[tuple[int, EmbeddingLine]],
                   results: dict[int, LineResult]) -> None:
    """One job's lines: each gets its inputs' embeddings, or the first error among them."""
    inputs = [i for _, parsed in members for i in parsed.inputs]
    try:
        result = await _embed(context, inputs, normalize)
    except LlamaqError as error:
        for position, parsed in members:
            results[position] = failed_line(parsed.line, error)
        return
    start = 0
    for position, parsed in members:
        items = result.items[start:start + len(parsed.inputs)]
        start += len(parsed.inputs)
        error_info = next((item.error for item in items if item.error is not None), None)
        if error_info is not None:
            results[position] = LineResult(False, output_line(
                parsed.line.custom_id, error_info.code, {"error": error_info.to_wire()}))
        else:
            results[position] = LineResult(True, output_line(
                parsed.line.custom_id, 200,
                render(parsed, result.pooling, items, context.model_id)))


async def _embed(context: OpenAIContext, inputs: list[EmbeddingInput],
                 normalize: int | None) -> EmbeddingResult:
    for attempt in range(RETRIES + 1):
        job = EmbeddingJob(model=context.model_id, inputs=inputs, embd_normalize=normalize,
                           per_input_errors=True, background=True)
        try:
            result = await context.fleet.jobs.run_embedding(job)
        except Unavailable as error:
            if attempt < RETRIES:
                log.warning("batch chunk job %s: %s; running it again", job.job_id,
                            error.message)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            raise
        if len(result.items) != len(inputs):
            raise ServerError(f"job {job.job_id}: {len(result.items)} embeddings for "
                              f"{len(inputs)} inputs")
        return result
    raise AssertionError("unreachable")

"""The lines of a /v1/embeddings batch chunk, run as few jobs: every input of every line of the
chunk goes into one background EmbeddingJob (one per embd_normalize value) with per-input errors,
so a chunk fills a worker's decode and a bad input fails only its own line. Each line's body is
llama-server's /v1/embeddings answer (format_embeddings_response_oaicompat)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from api.batch.input import BatchLine
from api.batch.lines import RETRIES, RETRY_PAUSE_S, LineResult, failed_line, output_line
from api.routes.openai_jobs import OpenAIContext
from scheduler.errors import InvalidRequest, LlamaqError, ServerError, Unavailable
from scheduler.jobs import EmbeddingInput, EmbeddingJob
from scheduler.results import EmbeddingItem, EmbeddingResult, pack_floats

log = logging.getLogger(__name__)

FIELDS = {"input", "model", "encoding_format", "embd_normalize", "user"}


@dataclass
class EmbeddingLine:
    line: BatchLine
    inputs: list[EmbeddingInput]
    base64: bool
    normalize: int | None
    model: str


def parse_line(line: BatchLine, model_id: str) -> EmbeddingLine:
    """A /v1/embeddings body as llama-server reads it (handle_embeddings_impl)."""
    body = line.body
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise InvalidRequest(f"{unknown[0]} is not supported by /v1/embeddings")
    if "input" not in body:
        raise InvalidRequest('"input" or "content" must be provided')
    prompt = body["input"]
    if isinstance(prompt, list) and prompt and all(_is_token(p) for p in prompt):
        inputs: list[EmbeddingInput] = [prompt]
    elif isinstance(prompt, list):
        inputs = [_input(p) for p in prompt]
    else:
        inputs = [_input(prompt)]
    if not inputs:
        raise InvalidRequest('"input" must not be empty')
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise InvalidRequest("The format to return the embeddings in. Can be either float or "
                             "base64")
    normalize = body.get("embd_normalize")
    if normalize is not None and (not isinstance(normalize, int) or isinstance(normalize, bool)):
        raise InvalidRequest("embd_normalize must be an integer")
    model = body.get("model")
    return EmbeddingLine(line, inputs, encoding == "base64", normalize,
                         model if isinstance(model, str) else model_id)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _input(value: Any) -> EmbeddingInput:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(_is_token(v) or isinstance(v, str) for v in value):
        return list(value)
    raise InvalidRequest('"input" must be a string, an array of strings, an array of tokens or '
                         "an array of arrays of tokens")


def render(parsed: EmbeddingLine, items: list[EmbeddingItem]) -> dict[str, Any]:
    data = []
    for index, item in enumerate(items):
        vector = item.vector()
        if parsed.base64:
            data.append({"embedding": pack_floats(vector), "index": index,
                         "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": vector, "index": index, "object": "embedding"})
    n_tokens = sum(item.n_tokens for item in items)
    return {"model": parsed.model, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "data": data}


async def run_embedding_chunk(context: OpenAIContext, lines: list[BatchLine]
                              ) -> list[LineResult]:
    results: dict[int, LineResult] = {}
    groups: dict[int | None, list[tuple[int, EmbeddingLine]]] = {}
    pooling_none = await _pooling_none(context)
    for position, line in enumerate(lines):
        try:
            if pooling_none:
                raise InvalidRequest("Pooling type 'none' is not OAI compatible. Please use a "
                                     "different pooling type")
            parsed = parse_line(line, context.model_id)
        except LlamaqError as error:
            results[position] = failed_line(line, error)
            continue
        groups.setdefault(parsed.normalize, []).append((position, parsed))
    for normalize, members in groups.items():
        inputs = [i for _, parsed in members for i in parsed.inputs]
        try:
            result = await _embed(context, inputs, normalize)
        except LlamaqError as error:
            for position, parsed in members:
                results[position] = failed_line(parsed.line, error)
            continue
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
                    parsed.line.custom_id, 200, render(parsed, items)))
    return [results[i] for i in range(len(lines))]


async def _pooling_none(context: OpenAIContext) -> bool:
    workers = await context.fleet.workers(context.model_id)
    return any(w.embedding and w.pooling == "none" for w in workers)


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

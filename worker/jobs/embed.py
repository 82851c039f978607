"""The body of an embedding or rerank job, on a worker started with --embedding or --rerank:
tokenize and check its inputs (in a thread unless they are short), decode them in the embedder
together with every other job's inputs, publish one final event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from scheduler.contract.errors import InvalidRequest, LlamaqError, NotSupported, ServerError
from scheduler.contract.jobs import EmbeddingJob, MediaPromptInput, RerankJob
from scheduler.contract.results import FinalEvent
from worker.embed.inputs import Prepared, embedding_inputs, rerank_inputs
from worker.embed.queue import EmbedRequest
from worker.jobs.parts import WorkerParts

QUICK_PREPARE_MAX_CHARS = 2048
"""Inputs of up to this many characters (or token ids) in all are tokenized on the event loop:
that takes well under a millisecond, less than the thread hand-offs of to_thread."""


def _text_chars(job: EmbeddingJob | RerankJob) -> int:
    texts = [job.query, *job.documents] if isinstance(job, RerankJob) else job.inputs
    return sum(len(text) for text in texts if not isinstance(text, MediaPromptInput))


async def _media_of(parts: WorkerParts, job: EmbeddingJob
                    ) -> dict[int, list[bytes] | LlamaqError]:
    """The bytes of each input with media (inline or from the object store by hash), or why
    they could not be read (llama-server's 500 on this path, as for bytes that do not decode)."""
    media: dict[int, list[bytes] | LlamaqError] = {}
    for index, item in enumerate(job.inputs):
        if isinstance(item, MediaPromptInput):
            try:
                media[index] = await parts.media().fetch(item.media)
            except InvalidRequest as error:
                media[index] = ServerError(error.message)
            except LlamaqError as error:
                media[index] = error
    return media


async def run(parts: WorkerParts, job: EmbeddingJob | RerankJob) -> None:
    """Run an embedding or rerank job (under the lease the caller took); its error is raised
    for the caller to publish."""
    embedder = parts.embedder
    if embedder is None:
        raise NotSupported("This server does not support embeddings. Start it with "
                           "`--embeddings`")
    model = embedder.model
    media = await _media_of(parts, job) if isinstance(job, EmbeddingJob) else {}
    if isinstance(job, RerankJob):
        prepare: Callable[[], list[Prepared]] = partial(rerank_inputs, job, model)
    else:
        prepare = partial(embedding_inputs, job, model, media)
    if not media and _text_chars(job) <= QUICK_PREPARE_MAX_CHARS:  # a thread hop costs more
        prepared = prepare()
    else:  # media are decoded and encoded (the vision tower) on this job's thread
        prepared = await asyncio.to_thread(prepare)
    failed = [item for item in prepared if item.error is not None]
    if failed and not job.per_input_errors:
        raise failed[0].error  # type: ignore[misc]
    normalize = parts.settings.embd_normalize
    if isinstance(job, EmbeddingJob) and job.embd_normalize is not None:
        normalize = job.embd_normalize
    request = EmbedRequest(job, [item for item in prepared if item.error is None], normalize,
                           errors={item.index: item.error.to_info() for item in failed
                                   if item.error is not None})
    future = embedder.submit(request)
    try:
        result = await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        embedder.cancel(job.job_id)
        raise
    sent = parts.publisher.expect(job.job_id)
    parts.publisher.publish([(job.job_id, FinalEvent(result=result))])
    await sent  # the lease ends after the result is on Redis, as a completion's does

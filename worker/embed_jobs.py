"""The embedding side of a worker started with --embedding or --rerank: its context settings,
its arq functions and queues, and how an embedding or rerank job runs (tokenize and check in a
thread, decode in the embedder with every other job's inputs, publish one final event)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import llama_cpp as lc
from arq.worker import Function, func

from scheduler import keys
from scheduler.jobs import EmbeddingJob, RerankJob
from scheduler.results import FinalEvent
from worker.embed_inputs import embedding_inputs, rerank_inputs
from worker.embedder import POOLING_TYPES, EmbedRequest
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

ONLINE_JOBS_PER_SEQ = 4
"""Online jobs a worker holds per sequence of a decode: enough that a decode is full while the
next jobs are tokenized."""
QUICK_PREPARE_MAX_CHARS = 2048
"""Inputs of up to this many characters (or token ids) in all are tokenized on the event loop:
that takes well under a millisecond, less than the thread hand-offs of to_thread."""
BACKGROUND_JOBS = 2
"""Background jobs (batch chunks) a worker holds at once: one decoding, one being prepared."""


def _text_chars(job: EmbeddingJob | RerankJob) -> int:
    texts = [job.query, *job.documents] if isinstance(job, RerankJob) else job.inputs
    return sum(len(text) for text in texts)


def embedding_mode(settings: WorkerSettings) -> bool:
    return settings.embedding or settings.rerank


def pooling_name(settings: WorkerSettings) -> str | None:
    """--rerank means rank pooling; else --pooling; None: the model's own."""
    if settings.rerank:
        return "rank"
    return settings.pooling


def tune_embedding_context(params: lc.llama_context_params, settings: WorkerSettings) -> None:
    """Embeddings on, the pooling asked for (else the model's)."""
    params.embeddings = True
    pooling = pooling_name(settings)
    params.pooling_type = POOLING_TYPES[pooling] if pooling else lc.LLAMA_POOLING_TYPE_UNSPECIFIED


def embedding_batch(settings: WorkerSettings) -> int:
    """llama-server's rule: with embeddings the logical batch is at most the physical one
    (a sequence is decoded whole in one ubatch)."""
    return min(settings.batch_size, settings.ubatch_size)


async def _embedding(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    from worker.jobrun import run_job

    await run_job(ctx, payload, "embedding")


async def _rerank(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    from worker.jobrun import run_job

    await run_job(ctx, payload, "rerank")


def embed_functions() -> list[Function]:
    return [func(_embedding, name="embedding"), func(_rerank, name="rerank")]


def embed_queues(model_id: str, n_seq_max: int) -> list[tuple[str, int]]:
    """(queue, jobs held at once) of an embedding worker."""
    return [(keys.embed_queue(model_id), max(1, n_seq_max) * ONLINE_JOBS_PER_SEQ),
            (keys.embed_background_queue(model_id), BACKGROUND_JOBS)]


async def run_embed_job(runtime: WorkerRuntime, job: EmbeddingJob | RerankJob) -> None:
    """Run an embedding or rerank job (under the lease the caller took); its error is raised
    for the caller to publish."""
    embedder = runtime.embedder
    assert embedder is not None  # only embed queues run this, and only an embedder has them
    model = embedder.model
    prepare = embedding_inputs if isinstance(job, EmbeddingJob) else rerank_inputs
    if _text_chars(job) <= QUICK_PREPARE_MAX_CHARS:  # a thread hop costs more than the work
        prepared = prepare(job, model)  # type: ignore[arg-type]
    else:
        prepared = await asyncio.to_thread(prepare, job, model)  # type: ignore[arg-type]
    failed = [item for item in prepared if item.error is not None]
    if failed and not job.per_input_errors:
        raise failed[0].error  # type: ignore[misc]
    normalize = runtime.settings.embd_normalize
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
    sent = runtime.publisher.expect(job.job_id)
    runtime.publisher.publish([(job.job_id, FinalEvent(result=result))])
    await sent  # the lease ends after the result is on Redis, as a completion's does

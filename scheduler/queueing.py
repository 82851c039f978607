"""How jobs travel through arq: the queue a job goes to, and JSON (never pickle) on the wire."""

from __future__ import annotations

import json
from typing import Any

from scheduler import keys
from scheduler.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    JobKind,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)

SLOT_FUNCTIONS = (JobKind.COMPLETION, JobKind.DECISION)
UTILITY_FUNCTIONS = (JobKind.TOKENIZE, JobKind.DETOKENIZE)
EMBED_FUNCTIONS = (JobKind.EMBEDDING, JobKind.RERANK)


def queue_for(job: CompletionJob | TokenizeJob | DetokenizeJob | SlotActionJob | EmbeddingJob
              | RerankJob | DecisionJob) -> str:
    """Completions and decisions need a slot; tokenize/detokenize need only the vocabulary
    and must not wait behind generations, so they have a queue of their own; embeddings and
    reranks go to the queues of embedding workers (background ones, batch chunks, to a queue
    of their own)."""
    if isinstance(job, EmbeddingJob | RerankJob):
        if job.background:
            return keys.embed_background_queue(job.model)
        return keys.embed_queue(job.model)
    if isinstance(job, CompletionJob | SlotActionJob | DecisionJob) and job.worker_id:
        return keys.worker_queue(job.model, job.worker_id)
    if job.kind in SLOT_FUNCTIONS:
        return keys.slot_queue(job.model)
    return keys.utility_queue(job.model)


def serialize_job(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def deserialize_job(data: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(data)
    return decoded

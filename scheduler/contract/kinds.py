"""The one kind table: what each JobKind is, in one place.

For each kind: its job model, the result its final event carries, the queue the api sends it
to (`home`; `background` for a batch's jobs), every queue whose arq worker runs its function
(`lanes`; the arq function is named as the kind), and whether it may run again on another
worker when its worker died before it sent anything (`movable`; a pinned job never may).
The api's queue choice (`queue_for`) and a worker's arq function tables
(worker/process/jobrun.py) are built from it. A new kind: a job model (jobs.py), a result
(results.py), a row here, a body in worker/jobs/.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from scheduler.contract import keys
from scheduler.contract.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    Job,
    JobKind,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.contract.results import (
    CompletionResult,
    DecisionResult,
    DetokenizeResult,
    EmbeddingResult,
    RerankResult,
    SlotActionResult,
    TokenizeResult,
)


class Lane(StrEnum):
    """A family of queues of a model (scheduler/contract/keys.py names each)."""

    SLOT = "slot"
    """Any worker of the model with a free slot."""
    WORKER = "worker"
    """One worker's own queue: jobs pinned to it (or routed to it by prefix affinity)."""
    BATCH = "batch"
    """Batch lines, started only in slots that online jobs leave free."""
    UTILITY = "utility"
    """Vocabulary only: never behind generations."""
    EMBED = "embed"
    """Embedding workers (--embedding, --rerank)."""
    EMBED_BACKGROUND = "embed_background"
    """Embedding workers' batch chunks, after every online input."""


def lane_queue(lane: Lane, model: str, worker_id: str = "") -> str:
    """The queue of `lane` for `model` (a WORKER lane needs the worker)."""
    match lane:
        case Lane.SLOT:
            return keys.slot_queue(model)
        case Lane.WORKER:
            assert worker_id, "a worker's own queue needs the worker"
            return keys.worker_queue(model, worker_id)
        case Lane.BATCH:
            return keys.batch_queue(model)
        case Lane.UTILITY:
            return keys.utility_queue(model)
        case Lane.EMBED:
            return keys.embed_queue(model)
        case Lane.EMBED_BACKGROUND:
            return keys.embed_background_queue(model)


@dataclass(frozen=True)
class KindSpec:
    job: type[BaseModel]
    result: type[BaseModel]
    home: Lane
    """Where the api sends a job of this kind that is not pinned and not a batch's."""
    lanes: frozenset[Lane]
    """Every lane whose arq worker runs this kind's function (WORKER among them: a job with a
    `worker_id` goes to that worker's own queue)."""
    movable: bool
    background: Lane | None = None
    """Where a batch's job of this kind (`background`) goes."""

    @property
    def pinnable(self) -> bool:
        return Lane.WORKER in self.lanes


KINDS: dict[JobKind, KindSpec] = {
    JobKind.COMPLETION: KindSpec(
        CompletionJob, CompletionResult, Lane.SLOT,
        frozenset({Lane.SLOT, Lane.WORKER, Lane.BATCH}), movable=True, background=Lane.BATCH),
    JobKind.DECISION: KindSpec(
        DecisionJob, DecisionResult, Lane.SLOT, frozenset({Lane.SLOT, Lane.WORKER}),
        movable=True),
    JobKind.SLOT_ACTION: KindSpec(
        SlotActionJob, SlotActionResult, Lane.WORKER, frozenset({Lane.WORKER}), movable=False),
    JobKind.TOKENIZE: KindSpec(
        TokenizeJob, TokenizeResult, Lane.UTILITY, frozenset({Lane.UTILITY}), movable=False),
    JobKind.DETOKENIZE: KindSpec(
        DetokenizeJob, DetokenizeResult, Lane.UTILITY, frozenset({Lane.UTILITY}),
        movable=False),
    JobKind.EMBEDDING: KindSpec(
        EmbeddingJob, EmbeddingResult, Lane.EMBED, frozenset({Lane.EMBED, Lane.EMBED_BACKGROUND}),
        movable=True, background=Lane.EMBED_BACKGROUND),
    JobKind.RERANK: KindSpec(
        RerankJob, RerankResult, Lane.EMBED, frozenset({Lane.EMBED, Lane.EMBED_BACKGROUND}),
        movable=True, background=Lane.EMBED_BACKGROUND),
}


def kinds_of(lane: Lane) -> list[JobKind]:
    """The kinds whose functions the arq worker of `lane` runs, in the table's order."""
    return [kind for kind, spec in KINDS.items() if lane in spec.lanes]


def movable(kind: str, worker_id: str | None, id_slot: int = -1) -> bool:
    """Whether a job of `kind` may run again elsewhere: a movable kind that no worker was
    chosen for (an unknown kind never may). A completion placed on a worker only to share its
    prompt cache (an `n_cmpl` group: `worker_id` without `id_slot`) may move too; one pinned
    to a slot (`id_slot`) never may."""
    try:
        spec = KINDS[JobKind(kind)]
    except ValueError:
        return False
    if kind == JobKind.COMPLETION:
        return spec.movable and id_slot < 0
    return spec.movable and not worker_id


def queue_for(job: Job) -> str:
    """The queue the api sends `job` to: its worker's own when it is pinned, its kind's
    background lane when it is a batch's, else its kind's home."""
    spec = KINDS[job.kind]
    worker_id = getattr(job, "worker_id", None)
    if worker_id and spec.pinnable:
        return lane_queue(Lane.WORKER, job.model, worker_id)
    if getattr(job, "background", False) and spec.background is not None:
        return lane_queue(spec.background, job.model)
    return lane_queue(spec.home, job.model)

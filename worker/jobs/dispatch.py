"""A job to its body, by kind (a `match` over scheduler/contract/jobs.py's union)."""

from __future__ import annotations

from scheduler.contract.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    Job,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.contract.results import Continuation
from worker.jobs import completion, decision, embed, slot_action, tokenize
from worker.jobs.parts import WorkerParts


async def run(parts: WorkerParts, job: Job, resumed: Continuation | None = None) -> None:
    """Run `job`'s body; `resumed` (completions only): continue a migrated completion."""
    match job:
        case CompletionJob():
            await completion.run(parts, job, resumed)
        case DecisionJob():
            await decision.run(parts, job)
        case SlotActionJob():
            await slot_action.run(parts, job)
        case TokenizeJob() | DetokenizeJob():
            await tokenize.run(parts, job)
        case EmbeddingJob() | RerankJob():
            await embed.run(parts, job)

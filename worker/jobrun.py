"""The arq job functions of a worker: take the job's lease, apply the re-run rule of
scheduler/leases.py, run the job, and make sure its client hears how it ended.

Owns: the arq functions of each queue, the lease around a job, dispatch by job kind (`match`
over scheduler/jobs.py's union), the end event of a job that died. Does not own: the job
bodies (worker/runtime.py, worker/embed_jobs.py), the re-run rule (scheduler/leases.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from arq import Retry
from arq.worker import Function, func

from scheduler.errors import LlamaqError, ServerError, Unavailable
from scheduler.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    JobKind,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
    parse_job,
)
from scheduler.leases import (
    MOVABLE_KINDS,
    Decision,
    Start,
    count_failure,
    count_retry,
    decide,
)
from scheduler.results import ErrorEvent
from storage import StorageError

if TYPE_CHECKING:
    from worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)

MAX_TRIES = 100
"""arq's own limit, out of the way: the re-run rule decides (a job handed back by a draining
worker is not a try)."""


class HandBack(Exception):
    """The job goes back to its queue unstarted, for another worker."""


def movable(kind: str, payload: dict[str, Any]) -> bool:
    """Only completions, embeddings, reranks and decisions that no worker was chosen for may
    run elsewhere."""
    return kind in MOVABLE_KINDS and not payload.get("worker_id")


async def run_job(ctx: dict[str, Any], payload: dict[str, Any], kind: str) -> None:
    runtime: WorkerRuntime = ctx["runtime"]
    job_id = str(payload.get("job_id", "?"))
    start = await runtime.leases.start(job_id)
    if start.cancelled:
        log.info("job %s: cancelled before it started", job_id)
        await runtime.leases.release(job_id)
        return
    decision = decide(start.tries, start.sent, movable(kind, payload))
    if decision is not Decision.RUN:
        await _end_dead_run(runtime, job_id, decision, start)
        return
    if start.tries > 1:
        log.warning("job %s: its worker died before it sent anything; running it again on "
                    "worker %s (try %d)", job_id, runtime.worker_id, start.tries)
        await count_retry(runtime.redis, runtime.model_id)
    if start.next_seq:
        runtime.publisher.resume(job_id, start.next_seq)  # after an earlier run's "started"
    try:
        assert runtime.sleeper is not None
        async with runtime.sleeper.job():  # wakes a sleeping worker first
            await _dispatch(runtime, payload, kind)
    except HandBack:
        log.info("job %s: handed back to the queue by draining worker %s", job_id,
                 runtime.worker_id)
        await runtime.leases.hand_back(job_id)
        raise Retry() from None
    except asyncio.CancelledError:
        runtime.leases.held.discard(job_id)  # the lease lapses: the job may run elsewhere
        raise
    except StorageError as error:
        log.debug("job %s: object storage: %s", job_id, error)
        runtime.fail(job_id, error)
    except Exception as error:  # ours, translated, or a bug: it still ends the job
        runtime.fail(job_id, error)
    await runtime.leases.release(job_id)


async def _dispatch(runtime: WorkerRuntime, payload: dict[str, Any], kind: str) -> None:
    """The job, validated by the union and of the kind its arq function runs (an unknown kind
    is an InvalidRequest, not a detokenize)."""
    match parse_job(payload, JobKind(kind)):
        case CompletionJob() as completion:
            await runtime.completion(completion)
        case DecisionJob() as decision:
            await runtime.decision(decision)
        case SlotActionJob() as action:
            await runtime.slot_action(action)
        case TokenizeJob() as tokenize:
            await runtime.tokenize(tokenize)
        case DetokenizeJob() as detokenize:
            await runtime.detokenize(detokenize)
        case EmbeddingJob() | RerankJob() as embed:
            await runtime.embed(embed)


async def _end_dead_run(runtime: WorkerRuntime, job_id: str, decision: Decision,
                        start: Start) -> None:
    """The job's last run died with its worker and it may not run again: tell its client
    (if the api waiting for it has not already)."""
    error: LlamaqError
    if decision is Decision.POISON:
        log.error("job %s: poison job: it was running when %d workers died; not running it "
                  "again", job_id, start.tries - 1)
        error = ServerError("this request was running on two workers that stopped; it is not "
                            "retried")
    else:
        log.warning("job %s: its worker died and it cannot run elsewhere", job_id)
        error = Unavailable("the worker running this request stopped")
    await count_failure(runtime.redis, runtime.model_id, decision.value)
    runtime.publisher.resume(job_id, start.next_seq)
    runtime.publisher.publish([(job_id, ErrorEvent(error=error.to_info()))])
    await runtime.leases.release(job_id)


async def _completion(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    await run_job(ctx, payload, "completion")


async def _decision(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    await run_job(ctx, payload, "decision")


async def _slot_action(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    await run_job(ctx, payload, "slot_action")


async def _tokenize(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    await run_job(ctx, payload, "tokenize")


async def _detokenize(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    await run_job(ctx, payload, "detokenize")


def slot_functions() -> list[Function]:
    """What the model's slot queue carries: jobs that need a slot of any worker."""
    return [func(_completion, name="completion"), func(_decision, name="decision")]


def completion_functions() -> list[Function]:
    """A worker's own queue: jobs for a slot, and slot actions."""
    return [*slot_functions(), func(_slot_action, name="slot_action")]


def utility_functions() -> list[Function]:
    return [func(_tokenize, name="tokenize"), func(_detokenize, name="detokenize")]

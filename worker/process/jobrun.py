"""The arq job functions of a worker: take the job's lease, apply the re-run rule of
scheduler/leases.py, run the job's body, and make sure its client hears how it ended.

Owns: the arq functions of each lane (built from the kind table, scheduler/contract/kinds.py),
the lease around a job, the end event of a job that died or failed. Does not own: the job
bodies (worker/jobs/), the re-run rule (scheduler/leases.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from arq import Retry
from arq.worker import Function, func

from scheduler.contract.errors import LlamaqError, ServerError, Unavailable, translate
from scheduler.contract.jobs import JobKind, parse_job
from scheduler.contract.kinds import Lane, kinds_of, movable
from scheduler.contract.results import ErrorEvent
from scheduler.leases import Decision, Start, count_failure, count_retry, decide
from storage import StorageError
from storage.redact import redact
from worker.jobs import dispatch
from worker.jobs.parts import HandBack, WorkerParts
from worker.process.sleep import Sleeper

log = logging.getLogger(__name__)

MAX_TRIES = 100
"""arq's own limit, out of the way: the re-run rule decides (a job handed back by a draining
worker is not a try)."""
CTX_KEY = "runner"
"""Where the JobRunner sits in the ctx arq hands every function."""


class JobRunner:
    """Runs one job of any kind on the worker's parts, as its arq function was called."""

    def __init__(self, parts: WorkerParts, sleeper: Sleeper) -> None:
        self.parts = parts
        self.sleeper = sleeper

    async def run(self, payload: dict[str, Any], kind: JobKind) -> None:
        parts = self.parts
        job_id = str(payload.get("job_id", "?"))
        start = await parts.leases.start(job_id)
        if start.cancelled:
            log.info("job %s: cancelled before it started", job_id)
            await parts.leases.release(job_id)
            return
        decision = decide(start.tries, start.sent, movable(kind, payload.get("worker_id")))
        if decision is not Decision.RUN:
            await self._end_dead_run(job_id, decision, start)
            return
        if start.tries > 1:
            log.warning("job %s: its worker died before it sent anything; running it again "
                        "on worker %s (try %d)", job_id, parts.worker_id, start.tries)
            await count_retry(parts.redis, parts.model_id)
        if start.next_seq:
            parts.publisher.resume(job_id, start.next_seq)  # after an earlier run's "started"
        try:
            async with self.sleeper.job():  # wakes a sleeping worker first
                # validated by the union and of the kind its function runs (an unknown kind
                # is an InvalidRequest, not a detokenize)
                await dispatch.run(parts, parse_job(payload, kind))
        except HandBack:
            log.info("job %s: handed back to the queue by draining worker %s", job_id,
                     parts.worker_id)
            await parts.leases.hand_back(job_id)
            raise Retry() from None
        except asyncio.CancelledError:
            parts.leases.held.discard(job_id)  # the lease lapses: the job may run elsewhere
            raise
        except StorageError as error:
            log.debug("job %s: object storage: %s", job_id, error)
            self.fail(job_id, error)
        except Exception as error:  # ours, translated, or a bug: it still ends the job
            self.fail(job_id, error)
        await parts.leases.release(job_id)

    def fail(self, job_id: str, error: Exception) -> None:
        """End the job with `error` (translated as the api translates it; a bug is a 500)."""
        ours = translate(error)
        if ours is None:
            log.exception("job %s: failed", job_id, exc_info=error)
            ours = ServerError(f"internal error: {redact(str(error))}")
        self.parts.publisher.publish([(job_id, ErrorEvent(error=ours.to_info()))])

    async def _end_dead_run(self, job_id: str, decision: Decision, start: Start) -> None:
        """The job's last run died with its worker and it may not run again: tell its client
        (if the api waiting for it has not already)."""
        parts = self.parts
        error: LlamaqError
        if decision is Decision.POISON:
            log.error("job %s: poison job: it was running when %d workers died; not running "
                      "it again", job_id, start.tries - 1)
            error = ServerError("this request was running on two workers that stopped; it is "
                                "not retried")
        else:
            log.warning("job %s: its worker died and it cannot run elsewhere", job_id)
            error = Unavailable("the worker running this request stopped")
        await count_failure(parts.redis, parts.model_id, decision.value)
        parts.publisher.resume(job_id, start.next_seq)
        parts.publisher.publish([(job_id, ErrorEvent(error=error.to_info()))])
        await parts.leases.release(job_id)


def _function(kind: JobKind) -> Function:
    async def run(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
        runner: JobRunner = ctx[CTX_KEY]
        await runner.run(payload, kind)

    run.__qualname__ = run.__name__ = f"run_{kind.value}"
    return func(run, name=kind.value)


def functions(lane: Lane) -> list[Function]:
    """The arq functions the worker of a `lane` queue runs: one per kind the table puts there,
    named as the kind."""
    return [_function(kind) for kind in kinds_of(lane)]

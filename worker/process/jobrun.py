"""The arq job functions of a worker: take the job's lease, apply the re-run rule of
scheduler/leases.py, run the job's body, and make sure its client hears how it ended.

Owns: the arq functions of each lane (built from the kind table, scheduler/contract/kinds.py),
the lease around a job, the end event of a job that died or failed. Does not own: the job
bodies (worker/jobs/), the re-run rule (scheduler/leases.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from arq import Retry
from arq.worker import Function, func

from scheduler.contract.errors import LlamaqError, Preempted, ServerError, Unavailable
from scheduler.contract.jobs import JobKind, parse_job
from scheduler.contract.kinds import Lane, kinds_of, movable
from scheduler.contract.results import Continuation, ErrorEvent
from scheduler.leases import (
    Decision,
    Start,
    count_failure,
    count_migration,
    count_preemption,
    count_retry,
    decide,
    observe_migration_stall,
)
from scheduler.migration import read_continuation
from scheduler.redis_errors import translate
from scheduler.tenant_limits import count_preempted
from storage import StorageError
from storage.redact import redact
from worker.jobs import dispatch
from worker.jobs.parts import HandBack, WorkerParts
from worker.process.sleep import Sleeper

log = logging.getLogger(__name__)

MAX_TRIES = 100
"""arq's own limit, out of the way: the re-run rule decides (a job handed back by a draining
worker is not a try)."""
START_EARLY_S = 10.0
"""How long a lease start begun ahead of its run waits for it (JobRunner.start_early)."""
CTX_KEY = "runner"
"""Where the JobRunner sits in the ctx arq hands every function."""


@dataclass(frozen=True)
class Running:
    """What preemption reads of a job this worker runs (worker/process/preempt.py)."""

    priority: int
    preempted: int
    """How many times it was preempted before this run."""
    kind: JobKind
    started: float = field(default_factory=time.monotonic)


class JobRunner:
    """Runs one job of any kind on the worker's parts, as its arq function was called."""

    def __init__(self, parts: WorkerParts, sleeper: Sleeper) -> None:
        self.parts = parts
        self.sleeper = sleeper
        self._background: set[asyncio.Task[None]] = set()
        self.running: dict[str, Running] = {}
        """The jobs this worker runs (or holds waiting for a slot), by id."""
        self._starts: dict[str, asyncio.Task[Start]] = {}
        """Lease starts begun ahead of their runs (`start_early`)."""

    def start_early(self, job_id: str) -> None:
        """Begin the lease start of a job this worker claimed and starts now (a preemption's
        seat: worker/process/preempt.py) while arq's own start of its run is on its way:
        the two round trips overlap instead of following each other on the urgent job's way
        to its slot (issue 47). A start that no run takes (arq found the job gone) lets the
        lease go after START_EARLY_S."""
        task = asyncio.get_running_loop().create_task(self.parts.leases.start(job_id))
        self._starts[job_id] = task
        asyncio.get_running_loop().call_later(START_EARLY_S, self._untaken, job_id, task)

    def _untaken(self, job_id: str, task: asyncio.Task[Start]) -> None:
        if self._starts.get(job_id) is not task:
            return
        del self._starts[job_id]
        if task.done() and task.exception() is None:
            release = asyncio.get_running_loop().create_task(self.parts.leases.release(job_id))
            self._background.add(release)
            release.add_done_callback(self._background.discard)
        elif not task.done():
            task.cancel()

    async def run(self, payload: dict[str, Any], kind: JobKind) -> None:
        parts = self.parts
        job_id = str(payload.get("job_id", "?"))
        prefetched = self._starts.pop(job_id, None)
        start = await (prefetched if prefetched is not None else parts.leases.start(job_id))
        if start.cancelled:
            log.info("job %s: cancelled before it started", job_id)
            await parts.leases.release(job_id)
            return
        limit = int(payload.get("migration_limit") or 0) if kind is JobKind.COMPLETION else 0
        decision = decide(start.tries, start.sent, movable(
            kind, payload.get("worker_id"), int(payload.get("id_slot", -1))), limit)
        resumed = None
        preempted = start.handed and start.sent > 0 and decision is Decision.RUN
        if decision is Decision.MIGRATE or preempted:
            resumed = await read_continuation(parts.redis, job_id, start.tries - 1,
                                              start.last_event_ms)
            if resumed is None:  # its log expired or was trimmed: it cannot continue
                decision = Decision.WORKER_DIED
        if decision not in (Decision.RUN, Decision.MIGRATE):
            await self._end_dead_run(job_id, decision, start)
            return
        self.running[job_id] = Running(int(payload.get("priority") or 0), start.preempted, kind)
        try:
            await self._run(payload, kind, start, resumed, limit, preempted)
        finally:
            self.running.pop(job_id, None)

    async def _run(self, payload: dict[str, Any], kind: JobKind, start: Start,
                   resumed: Continuation | None, limit: int, preempted: bool) -> None:
        parts = self.parts
        job_id = str(payload.get("job_id", "?"))
        if resumed is not None and preempted:
            log.info("job %s: preempted after %d tokens; continuing it on worker %s",
                     job_id, len(resumed.tokens), parts.worker_id)
            parts.publisher.resume(job_id, resumed.next_seq, max(start.sent, 1))
        elif resumed is not None:
            log.warning("job %s: worker %s died after %d tokens; continuing it on worker %s "
                        "(migration %d of at most %d)", job_id, start.previous_worker or "?",
                        len(resumed.tokens), parts.worker_id, resumed.migrations, limit)
            parts.publisher.resume(job_id, resumed.next_seq, max(start.sent, 1))
            parts.publisher.on_first_token(job_id, self._stall_observer(resumed.died_at_ms))
        elif start.tries > 1:
            log.warning("job %s: worker %s died before the job sent anything; running it "
                        "again on worker %s (try %d)", job_id, start.previous_worker or "?",
                        parts.worker_id, start.tries)
            await count_retry(parts.redis, parts.model_id)
        if start.next_seq and resumed is None:
            parts.publisher.resume(job_id, start.next_seq)  # after an earlier run's "started"
        try:
            async with self.sleeper.job():  # wakes a sleeping worker first
                # validated by the union and of the kind its function runs (an unknown kind
                # is an InvalidRequest, not a detokenize)
                await dispatch.run(parts, parse_job(payload, kind), resumed)
        except HandBack:
            log.info("job %s: handed back to the queue by draining worker %s", job_id,
                     parts.worker_id)
            await parts.leases.hand_back(job_id)
            raise Retry() from None
        except Preempted:
            log.info("job %s: preempted on worker %s: back to its queue", job_id,
                     parts.worker_id)
            await parts.leases.hand_back(job_id, preempted=True)
            await count_preemption(parts.redis, parts.model_id)
            await count_preempted(parts.redis, str(payload.get("tenant") or "default"),
                                  int(payload.get("priority") or 0))
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

    def _stall_observer(self, died_at_ms: int) -> Callable[[int], None]:
        """What the publisher calls when a continuation's first token went out (this worker's
        clock, ms): the job counts as migrated (a continuation handed back by a draining
        worker before it ran does not count twice), and the stall its client saw, from the
        last event before the death (the dead worker's clock), goes into the histogram
        (scheduler/leases.py observe_migration_stall)."""
        parts = self.parts

        async def record(stall_s: float | None) -> None:
            await count_migration(parts.redis, parts.model_id)
            if stall_s is not None:
                await observe_migration_stall(parts.redis, parts.model_id, stall_s)

        def observe(sent_at_ms: int) -> None:
            stall_s = max(0.0, (sent_at_ms - died_at_ms) / 1000) if died_at_ms > 0 else None
            if stall_s is not None:
                log.info("migrated job: first continued token %.2f s after the last event "
                         "before the death", stall_s)
            task = asyncio.create_task(record(stall_s))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        return observe

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
            log.error("job %s: poison job: it was running when %d workers died (the last: "
                      "%s); not running it again", job_id, start.tries - 1,
                      start.previous_worker or "?")
            error = ServerError(f"this request was running on {start.tries - 1} workers that "
                                "stopped; it is not retried")
        else:
            log.warning("job %s: its worker %s died and it cannot run elsewhere", job_id,
                        start.previous_worker or "?")
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

"""The events of a job as the api reads them: in order, gaps read back from the job's event
log, a silent job's worker checked (scheduler/leases.py); several jobs' events merged.

Owns: JobEvents (one job), merge_events (the jobs of one request, `n` > 1), AnyJob.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable

from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.affinity import RoutedJob, move_to_shared
from scheduler.contract import keys
from scheduler.contract.errors import (
    LlamaqError,
    NotFound,
    RedisUnreachable,
    ServerError,
    Unavailable,
    error_from_info,
)
from scheduler.contract.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.contract.kinds import movable, queue_for
from scheduler.contract.results import (
    RESULT,
    ErrorEvent,
    Event,
    EventEnvelope,
    FinalEvent,
    Result,
    StartedEvent,
    StoredFinalEvent,
    TokenEvent,
)
from scheduler.hub import EventHub, EventPointer, HubItem, Resync, next_within
from scheduler.job_hold import Hold
from scheduler.leases import Decision, count_failure, died_after, forget_queued
from scheduler.silent_jobs import Look, SilentJobs
from scheduler.wake import REWAKE_EVERY_S, wake_queue
from storage.errors import ObjectNotFound, StorageError
from storage.results import ResultStore

log = logging.getLogger(__name__)

AnyJob = (CompletionJob | TokenizeJob | DetokenizeJob | SlotActionJob | EmbeddingJob | RerankJob
          | DecisionJob)


class JobEvents:
    """The events of one job, in order, ending after its final or error event.

    An error event is raised as the typed error the worker reported. Events missed on pub/sub
    (a gap in the sequence, a big event sent as a pointer, a final event that never came) are
    read back from the job's event log. While the job is silent, its lease is checked (see
    scheduler/leases.py): a job whose worker died ends here with 503 (or 500 for a poison job)
    unless it is due to run again on another worker."""

    def __init__(self, job: AnyJob, queue: asyncio.Queue[HubItem], timeout_s: float,
                 redis: Redis, hub: EventHub, routed: RoutedJob | None = None,
                 results: ResultStore | None = None,
                 silent: SilentJobs | None = None) -> None:
        """`results`: where a worker puts final results too big for Redis; `silent`: the
        pod's looks at its silent jobs (one round trip for all; a dead worker seen at once)."""
        self.job_id = job.job_id
        self._results = results
        self._silent = silent if silent is not None else SilentJobs(redis)
        self._routed = routed
        """Set when cache-aware routing sent the job to a worker's own queue."""
        self._model_id = job.model
        self._pinned_worker = job.worker_id if isinstance(
            job, CompletionJob | SlotActionJob | DecisionJob) else None
        self._movable = movable(job.kind, self._pinned_worker,
                                job.id_slot if isinstance(job, CompletionJob) else -1)
        self._placed_moved = False
        """A placed job (an n_cmpl group's) left its dead worker's queue for the shared one."""
        self._migration_limit = job.migration_limit if isinstance(job, CompletionJob) else 0
        self._shared_queue = queue_for(job)
        """The queue whose workers take the job again when its worker died."""
        self._rewake_from = time.monotonic() + REWAKE_EVERY_S
        """While it waits unclaimed, from then on it asks the pod to wake one more worker."""
        self._queue = queue
        self._timeout_s = timeout_s
        self._redis = redis
        self._hub = hub
        self._next_seq = 0
        self._n_decoded = 0
        """The position of the last token handed on (see _repeated)."""
        self._shown = 0
        """Events with output read (a "started" event is none): may the job run again?"""
        self._rerun_of = 0
        """The run (tries) whose death already let the job go to another worker."""
        self._ready: deque[EventEnvelope] = deque()
        self.started = False
        """A slot took the job (its StartedEvent arrived)."""
        self._running = False
        """Its run is on a worker now (not waiting to run again): no --timeout."""
        self.finished = False
        self.handed_off = False
        self.ended_in_log = False
        """A resumed stream's job whose log held its last event when it was read."""
        """Left to a resumable stream's delayed cancel: leaving `submit` does not cancel."""
        self.on_event: Callable[[TokenEvent | FinalEvent | StartedEvent],
                                Awaitable[None]] | None = None
        """Called with each event before it is handed on (a tenant's token meter)."""
        self.hold: Hold | None = None
        """Set while the job waits for a model with no live worker (a cold start)."""

    def prefill(self, envelopes: list[EventEnvelope]) -> None:
        """Events read from the log before any arrive by pub/sub (a resumed stream)."""
        self._ready.extend(envelopes)
        self.ended_in_log = any(isinstance(e.event, FinalEvent | StoredFinalEvent | ErrorEvent)
                                for e in envelopes)

    @property
    def next_seq(self) -> int:
        """The seq of the next event to come (= how many of this job's events were read)."""
        return self._next_seq

    def __aiter__(self) -> JobEvents:
        return self

    async def __anext__(self) -> TokenEvent | FinalEvent | StartedEvent:
        if self.finished:
            raise StopAsyncIteration
        while True:
            try:
                envelope = await self._next_in_order()
            except RedisError as error:  # not finished: leaving cancels the job once Redis is back
                log.warning("job %s: Redis error while waiting for events: %r", self.job_id,
                            error)
                raise RedisUnreachable() from None
            self._next_seq = envelope.seq + 1
            if self.hold is not None:
                await self._release_hold()
            if not self._repeated(envelope.event):
                break
        event = envelope.event
        if isinstance(event, StoredFinalEvent):
            event = FinalEvent(result=await self._stored_result(event))
        if not isinstance(event, StartedEvent):
            self._shown += 1
        if self._routed is not None:
            self._routed.settle()  # whatever came: the job left the worker's queue
        if isinstance(event, ErrorEvent):
            self.finished = True
            raise error_from_info(event.error)
        if isinstance(event, FinalEvent):
            self.finished = True
        if isinstance(event, StartedEvent):
            self.started = self._running = True
        if self.on_event is not None:
            await self.on_event(event)
        return event

    def _repeated(self, event: Event) -> bool:
        """A token at a position already shown: a worker whose lease lapsed while it was
        starved wrote on after the job's continuation was read from its log (the continuing
        worker's "started" takes a seq, so the two runs' seqs differ by one); the client gets
        each position once, the first to come."""
        if not isinstance(event, TokenEvent) or not event.tokens or not event.n_decoded:
            return False
        if event.n_decoded <= self._n_decoded:
            log.warning("job %s: token %d came twice (a worker wrote after its lease lapsed); "
                        "dropped", self.job_id, event.n_decoded)
            return True
        self._n_decoded = event.n_decoded
        return False

    async def _stored_result(self, event: StoredFinalEvent) -> Result:
        """The result a worker put in the object store (storage/results.py)."""
        if self._results is None:
            raise ServerError("the worker stored this request's result, and this pod has no "
                              "object store to read it from")
        try:
            data = await asyncio.to_thread(self._results.get, event.key)
        except ObjectNotFound:
            raise NotFound("the result of this request expired") from None
        except StorageError as error:
            log.warning("job %s: cannot read its stored result %s (%s)", self.job_id,
                        event.key, error)
            raise Unavailable("the object store holding this request's result is "
                              "unreachable") from None
        return RESULT.validate_json(data)

    async def _next_in_order(self) -> EventEnvelope:
        """The event numbered `_next_seq`: from pub/sub, or read back from the log."""
        while True:
            if self._ready:
                envelope = self._ready.popleft()
            else:
                item = await self._next_item()
                if isinstance(item, LlamaqError):  # from the hub: the job may still run
                    raise item
                if isinstance(item, Resync):
                    self._ready.extend(await self._hub.read_log(self.job_id, self._next_seq))
                    continue
                if isinstance(item, EventPointer):
                    if item.seq < self._next_seq:
                        continue
                    self._ready.extend(await self._hub.read_log(self.job_id, self._next_seq,
                                                                item.seq))
                    continue
                envelope = item
            if envelope.seq < self._next_seq:
                continue  # already read back from the log
            if envelope.seq > self._next_seq:
                await self._recover_gap(envelope)
                continue
            return envelope

    async def _recover_gap(self, arrived: EventEnvelope) -> None:
        missing = await self._hub.read_log(self.job_id, self._next_seq, arrived.seq - 1)
        if [e.seq for e in missing] != list(range(self._next_seq, arrived.seq)):
            raise Unavailable(f"events {self._next_seq}..{arrived.seq - 1} of this request "
                              "were lost")
        log.info("job %s: recovered events %d..%d from the log", self.job_id, self._next_seq,
                 arrived.seq - 1)
        self._ready.extend([*missing, arrived])

    async def _next_item(self) -> HubItem:
        """The next event; a silent job is checked on every few seconds: its log may hold
        events pub/sub did not bring, and if the worker that took it stopped, waiting longer
        would hang the client forever. --timeout bounds a wait for a worker to take the job;
        a run on a live worker is not cut (llama-server's -to bounds its sockets only)."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            if not self._queue.empty():  # no task per event, nor wait_for's (issue 47)
                return self._queue.get_nowait()
            wait = min(keys.OWNER_CHECK_EVERY_S, deadline - time.monotonic())
            item = await next_within(self._queue, max(wait, 0.0))
            if item is not None:
                return item
            if time.monotonic() >= deadline:
                if not self._running:
                    raise Unavailable(f"no worker took this request within "
                                      f"{self._timeout_s:g} s (--timeout)")
                deadline = time.monotonic() + self._timeout_s
            try:
                if self.hold is not None:
                    await self._check_hold(self.hold)
                looked = await self._silent.look(
                    self.job_id, self._next_seq,
                    None if self._placed_moved else self._pinned_worker, self._queue)
                if not isinstance(looked, Look):
                    return looked  # it came while the look was on its way
                missed = await self._read_missed() if looked.logged else None
                if missed is not None:
                    return missed
                await self._check_worker(looked)
            except RedisError:
                continue  # Redis away: the hub decides when the outage ends the wait

    async def _check_hold(self, hold: Hold) -> None:
        """A held job: released once its model has a worker; past the deadline without one,
        taken out of its queue and ended with the hold's error."""
        if not await hold.cold():
            await self._release_hold()
        elif time.monotonic() >= hold.deadline:
            await forget_queued(self._redis, self._shared_queue, self.job_id)
            self.hold = None
            raise await hold.expired()

    async def _release_hold(self) -> None:
        hold, self.hold = self.hold, None
        if hold is not None:
            await hold.release()

    async def _read_missed(self) -> EventEnvelope | None:
        """Events in the job's log that pub/sub did not bring (e.g. a lost final event)."""
        logged = await self._hub.read_log(self.job_id, self._next_seq)
        if not logged:
            return None
        log.warning("job %s: %d events came only through the log", self.job_id, len(logged))
        self._ready.extend(logged[1:])
        return logged[0]

    async def _check_worker(self, look: Look) -> None:
        """Raise if the job's worker died and the job may not run again. A job that cache-aware
        routing sent to a worker's own queue moves to the shared queue when that worker did
        not take it in time, or when it may run again after its worker died (nobody polls a
        dead worker's queue)."""
        lapse = look.lapse()
        if lapse is None or lapse.tries == self._rerun_of:
            await self._unstick()
            if self._rerun_of:
                await self._move_placed()  # it was still held at the first look
            return
        decision = died_after(lapse.tries, max(lapse.sent, self._shown), self._movable,
                              self._migration_limit)
        if decision in (Decision.RUN, Decision.MIGRATE):
            log.warning("job %s: its worker died after %d events; it %s on another worker",
                        self.job_id, self._shown,
                        "runs again" if decision is Decision.RUN else "continues")
            self._rerun_of = lapse.tries
            self._running = False
            await self._unstick()
            await self._move_placed()
            # its queue's workers take it now, not at their next poll (up to --poll-delay)
            await wake_queue(self._redis, self._shared_queue)
            return
        if await self._hub.read_log(self.job_id, self._next_seq):
            # Its last events went out (the worker logs them before it counts them as sent)
            # and the lease ended after our look at the log: it finished, it did not die.
            return
        await count_failure(self._redis, self._model_id, decision.value)
        queued_at = (self._pinned_worker if not self._placed_moved else None) or (
            self._routed.worker_id if self._routed is not None and not self._routed.moved
            else None)
        if queued_at:  # its queue dies with its worker
            await forget_queued(self._redis, keys.worker_queue(self._model_id, queued_at),
                                self.job_id)
        if decision is Decision.POISON:
            log.error("job %s: poison job: it was running when %d workers died; ending it",
                      self.job_id, lapse.tries)
            raise ServerError(f"this request was running on {lapse.tries} workers that "
                              "stopped; it is not retried")
        log.warning("job %s: its worker stopped", self.job_id)
        raise Unavailable("the worker running this request stopped")

    async def _move_placed(self) -> None:
        """A job placed on the dead worker (an n_cmpl group's, movable) goes to the shared
        queue: nobody polls the dead worker's own queue."""
        if self._pinned_worker and self._movable and not self._placed_moved:
            self._placed_moved = await move_to_shared(
                self._redis, self._model_id, self._pinned_worker, self.job_id)
            if self._placed_moved:
                log.warning("job %s: moved from dead worker %s's queue to the shared queue",
                            self.job_id, self._pinned_worker)

    async def _unstick(self) -> None:
        if self._routed is not None and await self._routed.unstick():
            log.warning("job %s: not taken by worker %s; moved to the shared queue",
                        self.job_id, self._routed.worker_id)
        if not self._running and time.monotonic() >= self._rewake_from:
            self._silent.rewakes.ask(self._shared_queue, self.job_id)

    async def result(self) -> Result:
        async for event in self:
            if isinstance(event, FinalEvent):
                return event.result
        raise Unavailable(f"job {self.job_id} ended without a result")


ChoiceEvent = tuple[int, TokenEvent | FinalEvent | StartedEvent]
"""An event of one of several jobs run together, with the job's index."""


async def merge_events(streams: list[JobEvents]) -> AsyncGenerator[ChoiceEvent, None]:
    """Events of several jobs as they come, tagged with the job's index; a job's error is
    raised (and the other jobs are left, which cancels them)."""
    if len(streams) == 1:
        async for event in streams[0]:
            yield 0, event
        return
    queue: asyncio.Queue[ChoiceEvent | LlamaqError | None] = asyncio.Queue()

    async def pump(index: int, events: JobEvents) -> None:
        try:
            async for event in events:
                await queue.put((index, event))
            await queue.put(None)
        except LlamaqError as error:
            await queue.put(error)
        except Exception as error:  # a bug in one job's events must not hang the others
            log.exception("job %s: reading its events failed", events.job_id)
            await queue.put(ServerError(f"internal error: {type(error).__name__}"))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, LlamaqError):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()

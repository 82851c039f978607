"""What the api uses to run a job on the fleet: subscribe, enqueue, stream events, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from arq.connections import ArqRedis
from arq.constants import job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler import keys
from scheduler.affinity import Affinity, RoutedJob
from scheduler.errors import (
    LlamaqError,
    NotFound,
    RedisUnreachable,
    ServerError,
    Unavailable,
    error_from_info,
)
from scheduler.hub import EventHub, EventPointer, HubItem, Resync
from scheduler.jobs import (
    CompletionJob,
    DecisionJob,
    DetokenizeJob,
    EmbeddingJob,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.leases import (
    MOVABLE_KINDS,
    Decision,
    count_failure,
    died_after,
    forget_queued,
    lapsed_run,
    waiting_jobs,
)
from scheduler.queueing import queue_for
from scheduler.results import (
    AnyResult,
    CompletionResult,
    DetokenizeResult,
    EmbeddingResult,
    ErrorEvent,
    EventEnvelope,
    FinalEvent,
    RerankResult,
    Result,
    SlotActionResult,
    StartedEvent,
    TokenEvent,
    TokenizeResult,
    expect_result,
)
from scheduler.streams import StreamRecords

log = logging.getLogger(__name__)

AnyJob = (CompletionJob | TokenizeJob | DetokenizeJob | SlotActionJob | EmbeddingJob | RerankJob
          | DecisionJob)
QueueLimit = Callable[[str], Awaitable[int | None]]
"""How many jobs of a model may wait for a slot (None: no bound)."""
RETRY_AFTER_S = 5
"""Retry-After of a 503 for a full queue."""

ENQUEUE = """
-- KEYS: arq's job key, the job's arq result key, the queue; ARGV: job id, score (ms), expiry
-- (ms), the job as arq's serialize_job wrote it, the queue's wake channel.
-- arq's enqueue_job in one step (no second job under an id whose job or result key exists:
-- PSETEX the job, ZADD it to the queue), then the wake-up of the queue's workers.
-- Returns 1 if it enqueued the job, 0 if the id was taken.
local fresh = redis.call('EXISTS', KEYS[1], KEYS[2]) == 0
if fresh then
  redis.call('PSETEX', KEYS[1], ARGV[3], ARGV[4])
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
end
redis.call('PUBLISH', ARGV[5], '1')
if fresh then return 1 end
return 0
"""


class JobEvents:
    """The events of one job, in order, ending after its final or error event.

    An error event is raised as the typed error the worker reported. Events missed on pub/sub
    (a gap in the sequence, a big event sent as a pointer, a final event that never came) are
    read back from the job's event log. While the job is silent, its lease is checked (see
    scheduler/leases.py): a job whose worker died ends here with 503 (or 500 for a poison job)
    unless it is due to run again on another worker."""

    def __init__(self, job: AnyJob, queue: asyncio.Queue[HubItem], timeout_s: float,
                 redis: Redis, hub: EventHub, routed: RoutedJob | None = None) -> None:
        self.job_id = job.job_id
        self._routed = routed
        """Set when cache-aware routing sent the job to a worker's own queue."""
        self._model_id = job.model
        self._pinned_worker = job.worker_id if isinstance(
            job, CompletionJob | SlotActionJob | DecisionJob) else None
        self._movable = job.kind in MOVABLE_KINDS and not self._pinned_worker
        self._queue = queue
        self._timeout_s = timeout_s
        self._redis = redis
        self._hub = hub
        self._next_seq = 0
        self._shown = 0
        """Events with output read (a "started" event is none): may the job run again?"""
        self._rerun_of = 0
        """The run (tries) whose death already let the job go to another worker."""
        self._ready: deque[EventEnvelope] = deque()
        self.started = False
        """A slot took the job (its StartedEvent arrived)."""
        self.finished = False
        self.handed_off = False
        """Left to a resumable stream's delayed cancel: leaving `submit` does not cancel."""

    def prefill(self, envelopes: list[EventEnvelope]) -> None:
        """Events read from the log before any arrive by pub/sub (a resumed stream)."""
        self._ready.extend(envelopes)

    @property
    def next_seq(self) -> int:
        """The seq of the next event to come (= how many of this job's events were read)."""
        return self._next_seq

    def __aiter__(self) -> JobEvents:
        return self

    async def __anext__(self) -> TokenEvent | FinalEvent | StartedEvent:
        if self.finished:
            raise StopAsyncIteration
        try:
            envelope = await self._next_in_order()
        except RedisError as error:  # not finished: leaving cancels the job once Redis is back
            log.warning("job %s: Redis error while waiting for events: %r", self.job_id, error)
            raise RedisUnreachable() from None
        self._next_seq = envelope.seq + 1
        event = envelope.event
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
            self.started = True
        return event

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
        would hang the client forever."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            wait = min(keys.OWNER_CHECK_EVERY_S, deadline - time.monotonic())
            try:
                return await asyncio.wait_for(self._queue.get(), max(wait, 0.0))
            except TimeoutError:
                pass
            if time.monotonic() >= deadline:
                raise Unavailable(f"no answer from a worker within {self._timeout_s:g} s")
            try:
                missed = await self._read_missed()
                if missed is not None:
                    return missed
                await self._check_worker()
            except RedisError:
                continue  # Redis away: the hub decides when the outage ends the wait

    async def _read_missed(self) -> EventEnvelope | None:
        """Events in the job's log that pub/sub did not bring (e.g. a lost final event)."""
        logged = await self._hub.read_log(self.job_id, self._next_seq)
        if not logged:
            return None
        log.warning("job %s: %d events came only through the log", self.job_id, len(logged))
        self._ready.extend(logged[1:])
        return logged[0]

    async def _check_worker(self) -> None:
        """Raise if the job's worker died and the job may not run again. A job that cache-aware
        routing sent to a worker's own queue moves to the shared queue when that worker did
        not take it in time, or when it may run again after its worker died (nobody polls a
        dead worker's queue)."""
        lapse = await lapsed_run(self._redis, self.job_id, self._pinned_worker)
        if lapse is None or lapse.tries == self._rerun_of:
            await self._unstick()
            return
        decision = died_after(lapse.tries, max(lapse.sent, self._shown), self._movable)
        if decision is Decision.RUN:
            log.warning("job %s: its worker died before it sent anything; it runs again on "
                        "another worker", self.job_id)
            self._rerun_of = lapse.tries
            await self._unstick()
            return
        if await self._hub.read_log(self.job_id, self._next_seq):
            # Its last events went out (the worker logs them before it counts them as sent)
            # and the lease ended after our look at the log: it finished, it did not die.
            return
        await count_failure(self._redis, self._model_id, decision.value)
        queued_at = self._pinned_worker or (self._routed.worker_id if self._routed is not None
                                            and not self._routed.moved else None)
        if queued_at:  # its queue dies with its worker
            await forget_queued(self._redis, keys.worker_queue(self._model_id, queued_at),
                                self.job_id)
        if decision is Decision.POISON:
            log.error("job %s: poison job: it was running when %d workers died; ending it",
                      self.job_id, lapse.tries)
            raise ServerError("this request was running on two workers that stopped; it is "
                              "not retried")
        log.warning("job %s: its worker stopped", self.job_id)
        raise Unavailable("the worker running this request stopped")

    async def _unstick(self) -> None:
        if self._routed is not None and await self._routed.unstick():
            log.warning("job %s: not taken by worker %s; moved to the shared queue",
                        self.job_id, self._routed.worker_id)

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


class JobClient:
    def __init__(self, redis: Redis, arq: ArqRedis, hub: EventHub, timeout_s: float,
                 queue_limit: QueueLimit | None = None,
                 affinity: Affinity | None = None) -> None:
        """`queue_limit` says how many jobs of the model may wait (None: no bound);
        `affinity` routes completions to the worker that holds their prompt's beginning."""
        self._affinity = affinity
        self._redis = redis
        self._arq = arq
        self._hub = hub
        self._timeout_s = timeout_s
        self._queue_limit = queue_limit
        self._deferred_cancels: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        hub.on_reconnect.append(self._flush_deferred_cancels)
        self._open: dict[str, asyncio.Queue[HubItem]] = {}
        self._enqueue_script = redis.register_script(ENQUEUE)

    async def _enqueue(self, job: AnyJob, queue_name: str) -> None:
        """arq's enqueue_job (its serializer, so workers read the job unchanged; expiry
        JOB_TTL_S) and the wake-up of the queue's workers, in one round trip (EVALSHA)."""
        now_ms = timestamp_ms()
        data = serialize_job(job.kind, (job.model_dump(mode="json"),), {}, None, now_ms,
                             serializer=self._arq.job_serializer)
        enqueued = await self._enqueue_script(
            keys=[job_key_prefix + job.job_id, result_key_prefix + job.job_id, queue_name],
            args=[job.job_id, now_ms, int(keys.JOB_TTL_S * 1000), data,
                  keys.wake_channel(queue_name)])
        if not enqueued:
            log.warning("job %s: already enqueued (its id is taken)", job.job_id)

    @property
    def active(self) -> int:
        """Jobs whose events someone waits for (a draining api pod waits for them)."""
        return len(self._open)

    def end_all(self, error: LlamaqError) -> None:
        """Every waiting request gets `error` as its job's next event (a pod that stops)."""
        for queue in self._open.values():
            queue.put_nowait(type(error)(error.message))

    @contextlib.asynccontextmanager
    async def submit(self, job: AnyJob, queue: str | None = None) -> AsyncIterator[JobEvents]:
        """Run `job` (on `queue` instead of the job's own, e.g. a batch queue); leaving the
        block before its last event cancels it on the worker."""
        async with self._submit(job, queue) as events:
            yield events

    @contextlib.asynccontextmanager
    async def _submit(self, job: AnyJob, queue_name: str | None = None
                      ) -> AsyncIterator[JobEvents]:
        queue_name = queue_name or queue_for(job)
        routed = None
        if queue_name == keys.slot_queue(job.model) and self._affinity is not None \
                and isinstance(job, CompletionJob):
            worker_id = await self._affinity.route(job)
            if worker_id is not None:
                routed = RoutedJob(self._affinity, job.model, worker_id, job.job_id)
                queue_name = keys.worker_queue(job.model, worker_id)
        if routed is None and queue_name == keys.slot_queue(job.model):
            await self._check_room(job.model, queue_name)
        try:
            async with self._hub.subscription(job.job_id) as queue:
                self._open[job.job_id] = queue
                await self._enqueue(job, queue_name)
                events = JobEvents(job, queue, self._timeout_s, self._redis, self._hub, routed)
                async with self._watched(events):
                    yield events
        finally:
            if routed is not None:
                routed.settle()

    async def _check_room(self, model_id: str, queue_name: str) -> None:
        """Backpressure: past the bound, 503 with Retry-After at once instead of a wait."""
        if self._queue_limit is None:
            return
        limit = await self._queue_limit(model_id)
        if limit is None:
            return
        waiting, _ = await waiting_jobs(self._redis, queue_name)
        if waiting >= limit:
            raise Unavailable(f"the queue is full ({waiting} requests wait); retry later",
                              retry_after_s=RETRY_AFTER_S)

    @contextlib.asynccontextmanager
    async def attach(self, job: AnyJob) -> AsyncIterator[JobEvents]:
        """The events of a job submitted earlier (maybe by another pod), from its first one:
        its log, then what comes live. 404 when its log was trimmed."""
        async with self._hub.subscription(job.job_id) as queue:
            logged = await self._hub.read_log(job.job_id, 0)
            if logged and logged[0].seq != 0:
                raise NotFound("the events of this response expired")
            events = JobEvents(job, queue, self._timeout_s, self._redis, self._hub)
            events.prefill(logged)
            self._open[job.job_id] = queue
            async with self._watched(events):
                yield events

    @contextlib.asynccontextmanager
    async def _watched(self, events: JobEvents) -> AsyncIterator[None]:
        """Leaving the block (its events in `_open`) before the job's last event cancels it
        on the worker, unless the events were handed off."""
        try:
            yield
        finally:
            self._open.pop(events.job_id, None)
            if not events.finished and not events.handed_off:
                await asyncio.shield(self.cancel(events.job_id))

    def cancel_later(self, record_id: str, holder: str, job_ids: list[str]) -> None:
        """The client of a resumable stream went away: cancel its jobs after RESUME_GRACE_S
        unless another connection resumed the stream meanwhile."""

        async def cancel_unless_resumed() -> None:
            await asyncio.sleep(keys.RESUME_GRACE_S)
            try:
                now = await StreamRecords(self._redis).holder(record_id)
            except RedisError:
                now = None
            if now is None or now == holder:
                for job_id in job_ids:
                    await self.cancel(job_id)

        task = asyncio.create_task(cancel_unless_resumed())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run(self, job: AnyJob, queue: str | None = None) -> Result:
        """The job's result, of whatever kind (prefer the typed calls below)."""
        async with self.submit(job, queue) as events:
            return await events.result()

    async def run_embedding(self, job: EmbeddingJob) -> EmbeddingResult:
        """Embed the job's inputs on a worker of `job.model` started with --embedding; wait
        for all of them. One item per input, in input order (scheduler/results.py).

        Raises the typed error of the failing input (as llama-server answers: 400
        InvalidRequest for an empty input, 400 ExceedContextSize, 500 ServerError for an
        input larger than the physical batch) unless `job.per_input_errors`, where failed
        inputs carry their error in their item. A worker that dies before answering hands the
        job to another worker (nothing was sent yet); past that, 503 Unavailable (or 500 for
        a job that killed two workers). Leaving early (task cancelled) cancels it."""
        return await self._run_as(job, EmbeddingResult, None)

    async def run_rerank(self, job: RerankJob) -> RerankResult:
        """Score the job's documents against its query on a worker of `job.model` started
        with --rerank. One item per document, in document order (not sorted: sorting and
        top_n are the caller's). Errors as run_embedding."""
        return await self._run_as(job, RerankResult, None)

    async def _run_as(self, job: AnyJob, kind: type[AnyResult],
                      queue: str | None) -> AnyResult:
        return expect_result(await self.run(job, queue), kind)

    async def run_completion(self, job: CompletionJob,
                             queue: str | None = None) -> CompletionResult:
        return await self._run_as(job, CompletionResult, queue)

    async def tokenize(self, job: TokenizeJob, queue: str | None = None) -> TokenizeResult:
        return await self._run_as(job, TokenizeResult, queue)

    async def detokenize(self, job: DetokenizeJob,
                         queue: str | None = None) -> DetokenizeResult:
        return await self._run_as(job, DetokenizeResult, queue)

    async def slot_action(self, job: SlotActionJob,
                          queue: str | None = None) -> SlotActionResult:
        return await self._run_as(job, SlotActionResult, queue)

    @contextlib.asynccontextmanager
    async def controllable(self, completion_id: str, jobs: list[CompletionJob],
                           armed: bool) -> AsyncIterator[None]:
        """While a completion armed with reasoning_control runs, any api pod can end its
        thinking block with `end_reasoning(completion_id)`."""
        if not armed:
            yield
            return
        key = keys.chat_completion(completion_id)
        await self._redis.set(key, json.dumps([job.job_id for job in jobs]),
                              ex=keys.CANCEL_TTL_S)
        try:
            yield
        finally:
            await asyncio.shield(self._redis.delete(key))

    async def end_reasoning(self, completion_id: str) -> bool:
        """Ask the workers to end the completion's thinking block; False if it is unknown,
        finished or not armed."""
        job_ids = await self._redis.get(keys.chat_completion(completion_id))
        if job_ids is None:
            return False
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in json.loads(job_ids):
                pipe.publish(keys.CONTROL_CHANNEL, job_id)
            await pipe.execute()
        return True

    async def cancel(self, job_id: str) -> None:
        """Cancel the job on its worker; while Redis is away, as soon as it is back."""
        log.info("job %s: cancelled by the api", job_id)
        try:
            await self._send_cancels([job_id])
        except RedisError as error:
            log.warning("job %s: cancel deferred until Redis answers (%r)", job_id, error)
            self._deferred_cancels.add(job_id)

    async def _send_cancels(self, job_ids: list[str]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.set(keys.job_cancel(job_id), b"1", ex=keys.CANCEL_TTL_S)
                pipe.publish(keys.CANCEL_CHANNEL, job_id)
            await pipe.execute()

    async def _flush_deferred_cancels(self) -> None:
        job_ids, self._deferred_cancels = list(self._deferred_cancels), set()
        if job_ids:
            log.info("sending %d cancels deferred while Redis was away", len(job_ids))
            await self._send_cancels(job_ids)

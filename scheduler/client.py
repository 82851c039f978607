"""What the api uses to run a job on the fleet: subscribe, enqueue, stream events, cancel.

The events of a job, as it reads them, are scheduler/job_events.py's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix, result_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.affinity import Affinity, RoutedJob
from scheduler.contract import event_keys, keys, limits, preempt_keys
from scheduler.contract.errors import LlamaqError, NotFound, Unavailable
from scheduler.contract.jobs import (
    CompletionJob,
    DetokenizeJob,
    EmbeddingJob,
    RerankJob,
    SlotActionJob,
    TokenizeJob,
)
from scheduler.contract.kinds import queue_for
from scheduler.contract.results import (
    AnyResult,
    CompletionResult,
    DetokenizeResult,
    EmbeddingResult,
    RerankResult,
    Result,
    SlotActionResult,
    TokenizeResult,
    expect_result,
)
from scheduler.enqueue import ENQUEUE, refresh_stamp
from scheduler.fair_share import DEFAULT_TENANT, fair_args
from scheduler.hub import EventHub, HubItem
from scheduler.job_events import AnyJob, JobEvents
from scheduler.queue_index import index_key, indexed
from scheduler.queue_order import job_priority
from scheduler.silent_jobs import SilentJobs
from scheduler.streams import StreamRecords
from scheduler.worker_presence import WorkerPresence
from storage.results import ResultStore

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
"""Retry-After of a 503 for a full queue."""


DELETE_IF_SAME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class QueueRoom:
    """The backpressure bound of a model: at most `limit` jobs wait, counted over `queues`
    (its shared slot queue and its live workers' own queues)."""

    limit: int
    queues: tuple[str, ...]


QueueLimit = Callable[[str], Awaitable[QueueRoom | None]]
"""How many jobs of a model may wait for a slot, and in which queues (None: no bound)."""

class JobClient:
    def __init__(self, redis: Redis, arq: ArqRedis, hub: EventHub, timeout_s: float,
                 queue_limit: QueueLimit | None = None,
                 affinity: Affinity | None = None) -> None:
        """`queue_limit` says how many jobs of the model may wait (None: no bound);
        `affinity` routes completions to the worker that holds their prompt's beginning."""
        self._affinity = affinity
        self._redis = redis
        self._delete_if_same = redis.register_script(DELETE_IF_SAME)
        self._arq = arq
        self._hub = hub
        self._timeout_s = timeout_s
        self._queue_limit = queue_limit
        self.results: ResultStore | None = None
        """Where workers put final results too big for Redis (the pod's object store)."""
        self.presence = WorkerPresence(redis)
        """Which workers hold Redis connections (a dead one's jobs go on at once)."""
        self.silent = SilentJobs(redis, self.presence)
        """The pod's looks at its silent jobs, all in one round trip."""
        self.fair_share = True
        """False: every job counts as the default tenant's in the fair tags (first come, first
        served within a priority; --no-fair-share)."""
        self.quick_queue_max = limits.QUICK_QUEUE_MAX
        """The bound of the utility and online embedding queues (waiting jobs)."""
        self._deferred_cancels: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        hub.on_reconnect.append(self._flush_deferred_cancels)
        self._open: dict[str, asyncio.Queue[HubItem]] = {}
        self._enqueue_script = redis.register_script(ENQUEUE)

    async def _enqueue(self, job: AnyJob, queue_name: str, room: QueueRoom | None) -> None:
        """arq's enqueue_job (its serializer, so workers read the job unchanged; expiry
        JOB_TTL_S) and the wake-up of one waiting worker of the queue, in one round trip
        (EVALSHA), after the backpressure check of `room` in the same script: past the bound,
        503 with Retry-After at once instead of a wait."""
        now_ms = timestamp_ms()  # arq's enqueue_time in the job (informational); the queue's
        dumped = job.model_dump(mode="json")
        if isinstance(job, CompletionJob) and not job.reply_to and self._hub.channel:
            dumped["reply_to"] = self._hub.channel  # its events come to this pod's channel
        data = serialize_job(job.kind, (dumped,), {}, None, now_ms,
                             serializer=self._arq.job_serializer)  # score is Redis's TIME
        counted = list(room.queues) if room is not None else []
        tenant, cost = fair_args(job)
        tenant = tenant if self.fair_share else DEFAULT_TENANT
        status, waiting = await self._enqueue_script(
            keys=[job_key_prefix + job.job_id, result_key_prefix + job.job_id, queue_name,
                  keys.queue_order(queue_name), keys.fair_state(job.model),
                  index_key(job.model), preempt_keys.queue_preemptors(queue_name), *counted],
            args=[job.job_id, 0, int(keys.JOB_TTL_S * 1000), data,
                  keys.queue_waiters(queue_name), room.limit if room is not None else -1,
                  job_priority(job), in_progress_key_prefix, tenant, repr(cost),
                  keys.wake_channel(queue_name),
                  "1" if self._queue_limit is not None and indexed(job.model, queue_name)
                  else "0",
                  "1" if isinstance(job, CompletionJob)
                  and queue_name == keys.slot_queue(job.model) else "0",
                  refresh_stamp(job.model, queue_name)])
        if int(status) < 0:
            raise Unavailable(f"the queue is full ({int(waiting)} requests wait); retry later",
                              retry_after_s=RETRY_AFTER_S)
        if not int(status):
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
        room = None
        if self._queue_limit is not None and (
                routed is not None or queue_name == keys.slot_queue(job.model)):
            room = await self._queue_limit(job.model)
        elif queue_name in (keys.utility_queue(job.model), keys.embed_queue(job.model)):
            room = QueueRoom(self.quick_queue_max, (queue_name,))
        try:
            ours = isinstance(job, CompletionJob) and bool(self._hub.channel) \
                and job.reply_to in ("", self._hub.channel)  # _enqueue sets it so
            async with self._hub.subscription(job.job_id, confirm=not ours) as queue:
                self._open[job.job_id] = queue
                try:
                    await self._enqueue(job, queue_name, room)
                except BaseException:
                    self._open.pop(job.job_id, None)
                    raise
                events = JobEvents(job, queue, self._timeout_s, self._redis, self._hub, routed,
                                   self.results, self.silent)
                async with self._watched(events):
                    yield events
        finally:
            if routed is not None:
                routed.settle()

    @contextlib.asynccontextmanager
    async def attach(self, job: AnyJob) -> AsyncIterator[JobEvents]:
        """The events of a job submitted earlier (maybe by another pod), from its first one:
        its log, then what comes live. 404 when its log was trimmed."""
        async with self._hub.subscription(job.job_id) as queue:
            # its worker announces its events on the queuing pod's channel: on the job's own
            # too from now on (before the log is read: nothing falls between)
            await self._redis.set(event_keys.job_watched(job.job_id), "1",
                                  ex=keys.JOB_STATE_TTL_S)
            logged = await self._hub.read_log(job.job_id, 0)
            if logged and logged[0].seq != 0:
                raise NotFound("the events of this response expired")
            events = JobEvents(job, queue, self._timeout_s, self._redis, self._hub,
                               results=self.results, silent=self.silent)
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

    def cancel_later(self, record_id: str, holder: str, job_ids: list[str],
                     after: Callable[[bool], Awaitable[None]] | None = None) -> None:
        """The client of a resumable stream went away: cancel its jobs after RESUME_GRACE_S
        unless another connection resumed the stream meanwhile; then `after(resumed)`."""

        async def cancel_unless_resumed() -> None:
            await asyncio.sleep(keys.RESUME_GRACE_S)
            try:
                now = await StreamRecords(self._redis).holder(record_id)
            except RedisError:
                now = None
            resumed = not (now is None or now == holder)
            if not resumed:
                for job_id in job_ids:
                    await self.cancel(job_id)
            if after is not None:
                try:
                    await after(resumed)
                except RedisError as exc:  # Redis away: holds lapse by themselves
                    log.warning("stream %s: not settled after its grace: %r", record_id, exc)

        task = asyncio.create_task(cancel_unless_resumed())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def run(self, job: AnyJob, queue: str | None = None) -> Result:
        """The job's result, of whatever kind (prefer the typed calls below)."""
        async with self.submit(job, queue) as events:
            return await events.result()

    async def run_embedding(self, job: EmbeddingJob) -> EmbeddingResult:
        """Embed the job's inputs on a worker of `job.model` started with --embedding; wait
        for all of them. One item per input, in input order (scheduler/contract/results.py).

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
                           armed: bool, owner: str | None = None) -> AsyncIterator[None]:
        """While a completion armed with reasoning_control runs, any api pod can end its
        thinking block with `end_reasoning(completion_id)`; `owner`: the tenant whose it is
        (--tenants). A resumed stream arms it again with the stream's jobs; leaving deletes
        only this request's arming (not a resume's that came meanwhile)."""
        if not armed:
            yield
            return
        key = keys.chat_completion(completion_id)
        value = json.dumps({"job_ids": [job.job_id for job in jobs], "owner": owner,
                            "holder": uuid.uuid4().hex})
        await self._redis.set(key, value, ex=keys.CANCEL_TTL_S)
        try:
            yield
        finally:
            await asyncio.shield(self._delete_if_same(keys=[key], args=[value]))

    async def end_reasoning(self, completion_id: str,
                            owns: Callable[[str | None], bool] | None = None) -> bool:
        """Ask the workers to end the completion's thinking block; False if it is unknown,
        finished, not armed, or not the caller's (`owns` its owner: False)."""
        found = await self._redis.get(keys.chat_completion(completion_id))
        if found is None:
            return False
        armed = json.loads(found)
        if owns is not None and not owns(armed.get("owner")):
            return False
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in armed["job_ids"]:
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

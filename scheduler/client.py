"""What the api uses to run a job on the fleet: subscribe, enqueue, stream events, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from arq.connections import ArqRedis
from redis.asyncio import Redis

from scheduler import keys
from scheduler.errors import Unavailable, error_from_info
from scheduler.hub import EventHub
from scheduler.jobs import CompletionJob, DetokenizeJob, TokenizeJob
from scheduler.queueing import queue_for
from scheduler.results import ErrorEvent, EventEnvelope, FinalEvent, Result, TokenEvent

log = logging.getLogger(__name__)

AnyJob = CompletionJob | TokenizeJob | DetokenizeJob


class JobEvents:
    """The events of one job, in order, ending after its final or error event.

    An error event is raised as the typed error the worker reported."""

    def __init__(self, job_id: str, queue: asyncio.Queue[EventEnvelope], timeout_s: float) -> None:
        self.job_id = job_id
        self._queue = queue
        self._timeout_s = timeout_s
        self._next_seq = 0
        self.finished = False

    def __aiter__(self) -> JobEvents:
        return self

    async def __anext__(self) -> TokenEvent | FinalEvent:
        if self.finished:
            raise StopAsyncIteration
        try:
            envelope = await asyncio.wait_for(self._queue.get(), self._timeout_s)
        except TimeoutError:
            self.finished = True
            raise Unavailable(f"no answer from a worker within {self._timeout_s:g} s") from None
        if envelope.seq != self._next_seq:
            log.warning("job %s: event %d arrived, %d expected", self.job_id, envelope.seq,
                        self._next_seq)
        self._next_seq = envelope.seq + 1
        event = envelope.event
        if isinstance(event, ErrorEvent):
            self.finished = True
            raise error_from_info(event.error)
        if isinstance(event, FinalEvent):
            self.finished = True
        return event

    async def result(self) -> Result:
        async for event in self:
            if isinstance(event, FinalEvent):
                return event.result
        raise Unavailable(f"job {self.job_id} ended without a result")


class JobClient:
    def __init__(self, redis: Redis, arq: ArqRedis, hub: EventHub, timeout_s: float) -> None:
        self._redis = redis
        self._arq = arq
        self._hub = hub
        self._timeout_s = timeout_s

    @contextlib.asynccontextmanager
    async def submit(self, job: AnyJob) -> AsyncIterator[JobEvents]:
        """Run `job`; leaving the block before its last event cancels it on the worker."""
        queue_name = queue_for(job)
        async with self._hub.subscription(job.job_id) as queue:
            await self._arq.enqueue_job(
                job.kind, job.model_dump(mode="json"), _job_id=job.job_id, _queue_name=queue_name
            )
            await self._redis.publish(keys.wake_channel(queue_name), b"1")
            events = JobEvents(job.job_id, queue, self._timeout_s)
            try:
                yield events
            finally:
                if not events.finished:
                    await asyncio.shield(self.cancel(job.job_id))

    async def run(self, job: AnyJob) -> Result:
        async with self.submit(job) as events:
            return await events.result()

    async def cancel(self, job_id: str) -> None:
        log.info("job %s: cancelled by the api", job_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.job_cancel(job_id), b"1", ex=keys.CANCEL_TTL_S)
            pipe.publish(keys.CANCEL_CHANNEL, job_id)
            await pipe.execute()

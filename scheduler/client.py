"""What the api uses to run a job on the fleet: subscribe, enqueue, stream events, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from arq.connections import ArqRedis
from redis.asyncio import Redis

from scheduler import keys
from scheduler.errors import LlamaqError, Unavailable, error_from_info
from scheduler.hub import EventHub
from scheduler.jobs import (
    CompletionJob,
    DetokenizeJob,
    SlotActionJob,
    TokenizeJob,
    new_job_id,
)
from scheduler.queueing import queue_for
from scheduler.results import ErrorEvent, EventEnvelope, FinalEvent, Result, TokenEvent

log = logging.getLogger(__name__)

AnyJob = CompletionJob | TokenizeJob | DetokenizeJob | SlotActionJob
Retry = Callable[[], Awaitable[tuple[str, asyncio.Queue[EventEnvelope]]]]


class JobEvents:
    """The events of one job, in order, ending after its final or error event.

    An error event is raised as the typed error the worker reported."""

    def __init__(self, job_id: str, queue: asyncio.Queue[EventEnvelope], timeout_s: float,
                 redis: Redis, retry: Retry | None = None) -> None:
        """`retry` runs the job again under a new id (for a job whose worker died before it
        sent anything); None when the job cannot go elsewhere."""
        self.job_id = job_id
        self._queue = queue
        self._timeout_s = timeout_s
        self._redis = redis
        self._retry = retry
        self._next_seq = 0
        self.finished = False

    def __aiter__(self) -> JobEvents:
        return self

    async def __anext__(self) -> TokenEvent | FinalEvent:
        if self.finished:
            raise StopAsyncIteration
        envelope = await self._next_envelope()
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

    async def _next_envelope(self) -> EventEnvelope:
        """The next event; a silent job is checked on every few seconds: if the worker that
        took it stopped, waiting longer would hang the client forever."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            wait = min(keys.OWNER_CHECK_EVERY_S, deadline - time.monotonic())
            try:
                return await asyncio.wait_for(self._queue.get(), max(wait, 0.0))
            except TimeoutError:
                pass
            if time.monotonic() >= deadline:
                self.finished = True
                raise Unavailable(f"no answer from a worker within {self._timeout_s:g} s")
            if await self._owner_died():
                if self._retry is not None and self._next_seq == 0:
                    log.warning("job %s: its worker stopped before answering; retrying",
                                self.job_id)
                    self.job_id, self._queue = await self._retry()
                    self._retry = None  # once
                    continue
                self.finished = True
                raise Unavailable("the worker running this request stopped")

    async def _owner_died(self) -> bool:
        owner = await self._redis.get(keys.job_owner(self.job_id))
        if owner is None:
            return False  # still queued
        return not await self._redis.exists(keys.worker_info(owner.decode()))

    async def result(self) -> Result:
        async for event in self:
            if isinstance(event, FinalEvent):
                return event.result
        raise Unavailable(f"job {self.job_id} ended without a result")


ChoiceEvent = tuple[int, TokenEvent | FinalEvent]
"""An event of one of several jobs run together, with the job's index."""


async def merge_events(streams: list[JobEvents]) -> AsyncIterator[ChoiceEvent]:
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
    def __init__(self, redis: Redis, arq: ArqRedis, hub: EventHub, timeout_s: float) -> None:
        self._redis = redis
        self._arq = arq
        self._hub = hub
        self._timeout_s = timeout_s

    @contextlib.asynccontextmanager
    async def submit(self, job: AnyJob) -> AsyncIterator[JobEvents]:
        """Run `job`; leaving the block before its last event cancels it on the worker."""
        async with contextlib.AsyncExitStack() as subscriptions:

            async def start(attempt: AnyJob) -> asyncio.Queue[EventEnvelope]:
                queue = await subscriptions.enter_async_context(
                    self._hub.subscription(attempt.job_id))
                queue_name = queue_for(attempt)
                await self._arq.enqueue_job(attempt.kind, attempt.model_dump(mode="json"),
                                            _job_id=attempt.job_id, _queue_name=queue_name)
                await self._redis.publish(keys.wake_channel(queue_name), b"1")
                return queue

            async def retry() -> tuple[str, asyncio.Queue[EventEnvelope]]:
                nonlocal job
                await self.cancel(job.job_id)  # a late pick-up of the old id must do nothing
                job = job.model_copy(update={"job_id": new_job_id()})
                return job.job_id, await start(job)

            pinned = isinstance(job, CompletionJob | SlotActionJob) and job.worker_id
            events = JobEvents(job.job_id, await start(job), self._timeout_s, self._redis,
                               None if pinned else retry)
            try:
                yield events
            finally:
                if not events.finished:
                    await asyncio.shield(self.cancel(events.job_id))

    async def run(self, job: AnyJob) -> Result:
        async with self.submit(job) as events:
            return await events.result()

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
        log.info("job %s: cancelled by the api", job_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.job_cancel(job_id), b"1", ex=keys.CANCEL_TTL_S)
            pipe.publish(keys.CANCEL_CHANNEL, job_id)
            await pipe.execute()

"""Job events from the engine thread to Redis pub/sub: one pipeline per batch of steps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from scheduler import keys
from scheduler.results import EventEnvelope, FinalEvent
from worker.engine import JobEvent

log = logging.getLogger(__name__)


class EventPublisher:
    """Numbers each job's events and publishes them in order; resolves a job's future when its
    final or error event has gone out."""

    def __init__(self, redis: Redis,
                 before_results: Callable[[Pipeline], None] = lambda _: None) -> None:
        """`before_results` adds commands to the pipeline of a batch that ends jobs, ahead
        of the events (so what it writes is there when the client gets its result)."""
        self._redis = redis
        self._before_results = before_results
        self._loop = asyncio.get_running_loop()
        self._pending: asyncio.Queue[list[JobEvent]] = asyncio.Queue()
        self._next_seq: dict[str, int] = {}
        self._done: dict[str, asyncio.Future[None]] = {}
        self._dropped: set[str] = set()

    def from_thread(self, events: list[JobEvent]) -> None:
        """The engine's sink: called from the engine thread."""
        self._loop.call_soon_threadsafe(self._pending.put_nowait, events)

    def publish(self, events: list[JobEvent]) -> None:
        self._pending.put_nowait(events)

    def expect(self, job_id: str) -> asyncio.Future[None]:
        future = self._loop.create_future()
        self._done[job_id] = future
        return future

    def resume(self, job_id: str, seq: int) -> None:
        """The job's next event is number `seq` (a run on another worker sent the others)."""
        self._next_seq[job_id] = seq

    def abandon(self, job_id: str, reason: BaseException) -> None:
        """This worker sends nothing more for the job (its lease went to another worker, or it
        goes back to the queue); whoever awaits the job gets `reason`."""
        self._dropped.add(job_id)
        self._next_seq.pop(job_id, None)
        future = self._done.pop(job_id, None)
        if future is not None and not future.done():
            future.set_exception(reason)

    async def run(self) -> None:
        while True:
            events = await self._pending.get()
            while not self._pending.empty():
                events.extend(self._pending.get_nowait())
            await self._send(events)

    async def _send(self, events: list[JobEvent]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            if any(event.kind in ("final", "error") for _, event in events):
                self._before_results(pipe)
            sent: dict[str, int] = {}
            for job_id, event in events:
                if job_id in self._dropped:
                    continue
                seq = self._next_seq.get(job_id, 0)
                self._next_seq[job_id] = sent[job_id] = seq + 1
                envelope = EventEnvelope(job_id=job_id, seq=seq, event=event)
                pipe.publish(keys.job_events(job_id), envelope.model_dump_json())
            for job_id, n_sent in sent.items():  # a re-run must know whether anything went out
                pipe.hset(keys.job_state(job_id), "sent", str(n_sent))
                pipe.expire(keys.job_state(job_id), keys.JOB_STATE_TTL_S)
            try:
                await pipe.execute()
            except RedisError:
                log.exception("could not publish %d events", len(events))
        for job_id, event in events:
            if event.kind in ("final", "error"):
                self._finish(job_id, isinstance(event, FinalEvent))

    def _finish(self, job_id: str, ok: bool) -> None:
        self._next_seq.pop(job_id, None)
        self._dropped.discard(job_id)
        future = self._done.pop(job_id, None)
        if future is not None and not future.done():
            future.set_result(None)
        log.debug("job %s: ended (%s)", job_id, "final" if ok else "error")

"""A queued job wakes one waiting worker, not every worker of its queue (issue 44, the herd:
scheduler/wake.py). Real Redis, the api's enqueue script (JobClient._enqueue), real
WakeableWorkers and the wake channels the worker's listener subscribes to; the workers' safety
poll (--poll-delay) is a minute here, so only wakes can start a job within the test."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from arq import Retry
from arq.connections import ArqRedis, create_pool
from arq.worker import func
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.contract.jobs import CompletionJob
from scheduler.hub import EventHub
from scheduler.queueing import deserialize_job, serialize_job
from worker.process.arq_worker import WakeableWorker
from worker.process.loops import wake_channels

pytestmark = pytest.mark.process

NO_SAFETY_POLL_S = 60.0


@pytest_asyncio.fixture
async def pod(redis_url: str) -> AsyncIterator[tuple[Redis, ArqRedis, JobClient]]:
    redis = Redis.from_url(redis_url)
    pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    yield redis, pool, JobClient(redis, pool, EventHub(redis), 10)
    await pool.aclose()
    await redis.aclose()


class Fleet:
    """Workers of one queue, each counting its polls, and one listener for their channels
    (worker/process/loops.py wake_channels: what the worker's own listener subscribes to)."""

    def __init__(self, redis: Redis, pool: ArqRedis, queue: str) -> None:
        self.redis, self.pool, self.queue = redis, pool, queue
        self.workers: dict[str, WakeableWorker] = {}
        self.polls: dict[str, int] = {}
        self.runs: list[tuple[str, str]] = []
        self.release = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    def add(self, name: str, max_jobs: int = 2) -> WakeableWorker:
        async def completion(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
            self.runs.append((name, ctx["job_id"]))
            if payload.get("prompt") == "hand back" and ctx["job_try"] == 1:
                raise Retry()  # as worker/process/jobrun.py's hand-backs (drain, preemption)
            if payload.get("prompt") == "block":
                await self.release.wait()

        worker = WakeableWorker(
            [func(completion, name="completion")], queue_name=self.queue,
            redis_pool=self.pool, max_jobs=max_jobs, job_timeout=3600, max_tries=100,
            keep_result=0, poll_delay=NO_SAFETY_POLL_S, handle_signals=False,
            job_serializer=serialize_job, job_deserializer=deserialize_job, log_results=False)
        worker.wake_me = keys.worker_wake_channel(self.queue, name)
        poll = worker._poll_iteration

        async def counted() -> None:
            self.polls[name] = self.polls.get(name, 0) + 1
            await poll()

        worker._poll_iteration = counted  # type: ignore[method-assign]
        self.workers[name] = worker
        return worker

    async def start(self, *names: str) -> None:
        """Run these workers; back once each waits for a job (its first poll found none)."""
        for name in names:
            self._tasks.append(asyncio.create_task(self.workers[name].main()))
            await until_true(functools.partial(self.waiting, name))

    def waiting(self, name: str) -> Any:
        return self.redis.zscore(keys.queue_waiters(self.queue), self.workers[name].wake_me)

    async def listen(self, ready: asyncio.Event) -> None:
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        by_channel: dict[str, Callable[[], None]] = wake_channels(self.workers.values())
        await pubsub.subscribe(*by_channel)
        ready.set()
        try:
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    by_channel[message["channel"].decode()]()
        finally:
            await pubsub.aclose()

    async def stop(self) -> None:
        self.release.set()
        for task in self._tasks:
            task.cancel()
        for worker in self.workers.values():
            for job_task in worker.tasks.values():
                job_task.cancel()
        await asyncio.gather(*self._tasks, *(t for w in self.workers.values()
                                             for t in w.tasks.values()),
                             return_exceptions=True)


@contextlib.asynccontextmanager
async def fleet(pod: tuple[Redis, ArqRedis, JobClient], *names: str,
                max_jobs: int = 2) -> AsyncIterator[Fleet]:
    redis, pool, _ = pod
    the = Fleet(redis, pool, keys.slot_queue(f"wake-{time.monotonic_ns()}"))
    for name in names:
        the.add(name, max_jobs)
    ready = asyncio.Event()
    listener = asyncio.create_task(the.listen(ready))
    await ready.wait()
    try:
        yield the
    finally:
        await the.stop()
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)


async def until_true(check: Callable[[], Any], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            if result:
                return
            await asyncio.sleep(0.02)


def job(queue: str, prompt: str = "p") -> CompletionJob:
    return CompletionJob(model=queue.split(":")[2], prompt=prompt)


async def test_a_queued_job_wakes_one_waiting_worker_not_all(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """Eight idle workers: one job costs one poll (the herd cost eight, one claim script
    each), and the worker that took it waits again."""
    names = [f"w{i}" for i in range(8)]
    async with fleet(pod, *names) as the:
        await the.start(*names)
        polls_before = sum(the.polls.values())
        await pod[2]._enqueue(job(the.queue), the.queue, None)
        await until_true(lambda: the.runs)
        await asyncio.sleep(0.5)  # any other wake would have come by now
        assert sum(the.polls.values()) - polls_before == 1
        taker = the.runs[0][0]
        assert taker == "w0"  # as much room as the others, and the oldest look
        await until_true(lambda: the.waiting(taker))


async def test_each_of_many_queued_jobs_wakes_a_worker(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """Jobs queued together while workers are busy with them: every job is taken, by wakes
    alone, and each taker waits again once it has room."""
    names = [f"w{i}" for i in range(4)]
    async with fleet(pod, *names, max_jobs=1) as the:
        await the.start(*names)
        for i in range(12):
            await pod[2]._enqueue(job(the.queue, f"j{i}"), the.queue, None)
        await until_true(lambda: len(the.runs) == 12)
        for name in names:
            await until_true(functools.partial(the.waiting, name))


async def test_a_woken_worker_with_no_room_passes_the_wake_on(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """The worker that waited longest has no room when the job comes (its room went to
    another queue's jobs, as a batch lane's does): it wakes the next waiter instead."""
    async with fleet(pod, "full", "free") as the:
        await the.start("full", "free")
        the.workers["full"].room = lambda: 0
        await pod[2]._enqueue(job(the.queue), the.queue, None)
        await until_true(lambda: the.runs, timeout=5)
        assert the.runs[0][0] == "free"


async def test_a_waiter_nobody_listens_to_is_skipped(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """A worker that died waiting left its channel in the waiters: the job goes to the next
    one, and the dead channel is gone."""
    async with fleet(pod, "live") as the:
        dead = keys.worker_wake_channel(the.queue, "dead")
        await the.redis.zadd(keys.queue_waiters(the.queue), {dead: -1e15})  # first in line
        await the.start("live")
        await pod[2]._enqueue(job(the.queue), the.queue, None)
        await until_true(lambda: the.runs, timeout=5)
        assert await the.redis.zscore(keys.queue_waiters(the.queue), dead) is None


async def test_a_job_queued_while_every_worker_is_full_starts_when_one_ends(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    async with fleet(pod, "only", max_jobs=1) as the:
        await the.start("only")
        await pod[2]._enqueue(job(the.queue, "block"), the.queue, None)
        await until_true(lambda: the.runs)
        assert not await the.waiting("only")  # full: it waits for no job
        await pod[2]._enqueue(job(the.queue, "next"), the.queue, None)
        await asyncio.sleep(0.3)
        assert len(the.runs) == 1
        the.release.set()
        await until_true(lambda: len(the.runs) == 2, timeout=5)


async def test_a_draining_worker_stops_waiting_and_hands_its_wake_on(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    async with fleet(pod, "draining", "staying") as the:
        await the.start("draining", "staying")
        draining = the.workers["draining"]
        draining.taking = False  # as worker/process/serve.py _drain
        draining.wake.set()
        await until_true(lambda: the._tasks[0].done())
        assert await the.waiting("draining") is None
        await pod[2]._enqueue(job(the.queue), the.queue, None)
        await until_true(lambda: the.runs, timeout=5)
        assert the.runs[0][0] == "staying"


async def test_a_job_handed_back_to_its_queue_wakes_a_waiting_worker(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """A run handed back (a draining worker's, a preempted one's) leaves its job in the queue
    with no enqueue to announce it: the hand-back wakes a waiting worker itself, instead of
    leaving the job to the next safety poll (--idle-poll-delay, half a minute)."""
    async with fleet(pod, "only") as the:
        await the.start("only")
        await pod[2]._enqueue(job(the.queue, "hand back"), the.queue, None)
        await until_true(lambda: len(the.runs) == 2, timeout=5)
        assert the.runs[0][1] == the.runs[1][1]

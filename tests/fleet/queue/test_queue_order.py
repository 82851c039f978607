"""The order in which workers take waiting jobs (issue 47, scheduler/queue_order.py): by
priority, lower first, then by arrival; a job queued by arq's own enqueue_job after the ordered
ones; a job that ended leaves the order. Real Redis, the real arq pool and the scripts the api
and the workers run."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import arq.utils
import pytest
import pytest_asyncio
from arq.connections import ArqRedis, create_pool
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.contract.jobs import CompletionJob
from scheduler.hub import EventHub
from scheduler.leases import CLAIM_JOBS, waiting_jobs
from scheduler.queue_order import claim_keys, queue_order_of
from scheduler.queueing import deserialize_job, serialize_job

pytestmark = pytest.mark.process


@pytest_asyncio.fixture
async def pod(redis_url: str) -> AsyncIterator[tuple[Redis, ArqRedis, JobClient]]:
    redis = Redis.from_url(redis_url)
    pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    yield redis, pool, JobClient(redis, pool, EventHub(redis), 10)
    await pool.aclose()
    await redis.aclose()


async def claim(redis: Redis, queue: str, wanted: int) -> list[str]:
    """A worker's poll (worker/process/arq_worker.py's arguments)."""
    claimed = await redis.register_script(CLAIM_JOBS)(
        keys=claim_keys(queue), args=[arq.utils.timestamp_ms(), wanted,
                                      in_progress_key_prefix, 3000])
    return [claimed[i].decode() for i in range(0, len(claimed), 2)]


async def test_jobs_are_taken_by_priority_then_arrival(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, pool, client = pod
    model = f"order-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    jobs = {name: CompletionJob(model=model, prompt=name, priority=priority)
            for name, priority in [("a10", 10), ("b0", 0), ("c10", 10), ("d-5", -5),
                                   ("e0", None), ("f10", 10)]}
    for job in jobs.values():
        await client._enqueue(job, queue, None)
    await pool.enqueue_job("completion", {}, _job_id="arq-own", _queue_name=queue)
    names = {job.job_id: name for name, job in jobs.items()} | {"arq-own": "arq-own"}
    assert (await waiting_jobs(redis, queue))[0] == 7  # the queue itself is as it was
    assert [names[j] for j in await claim(redis, queue, 3)] == ["d-5", "b0", "e0"]
    assert [names[j] for j in await claim(redis, queue, 10)] == ["a10", "c10", "f10",
                                                                 "arq-own"]
    assert await claim(redis, queue, 10) == []


async def test_a_job_that_ended_leaves_the_order(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"order-end-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    first, second = (CompletionJob(model=model, prompt=p, priority=3) for p in ("1", "2"))
    await client._enqueue(first, queue, None)
    await client._enqueue(second, queue, None)
    await redis.zrem(queue, first.job_id)  # what arq does when a job ends
    assert await claim(redis, queue, 5) == [second.job_id]
    assert await redis.zrange(queue_order_of(queue, 3), 0, -1) == [
        second.job_id.encode()]
    await redis.zrem(queue, second.job_id)
    assert await claim(redis, queue, 5) == []
    assert not await redis.exists(keys.queue_order(queue), queue_order_of(queue, 3))


async def test_a_job_handed_back_goes_before_later_ones(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"order-back-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    early, late = (CompletionJob(model=model, prompt=p, priority=1) for p in ("e", "l"))
    await client._enqueue(early, queue, None)
    assert await claim(redis, queue, 1) == [early.job_id]
    await client._enqueue(late, queue, None)
    await redis.delete(in_progress_key_prefix + early.job_id)  # handed back
    assert await claim(redis, queue, 2) == [early.job_id, late.job_id]

"""Queue scores on Redis's clock (issue 27, hole 4): an api pod whose clock is an hour ahead
or behind (its `time` monkeypatched) enqueues jobs that a worker with a right clock takes at
once and in arrival order, and whose wait /metrics measures sanely. Real Redis, the real arq
pool and the scripts the api and the workers run."""

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
from scheduler.contract.jobs import TokenizeJob
from scheduler.hub import EventHub
from scheduler.leases import CLAIM_JOBS, waiting_jobs
from scheduler.queue_order import claim_keys
from scheduler.queueing import deserialize_job, serialize_job

pytestmark = pytest.mark.process
HOUR_S = 3600.0


@pytest_asyncio.fixture
async def pod(redis_url: str) -> AsyncIterator[tuple[Redis, ArqRedis, JobClient]]:
    redis = Redis.from_url(redis_url)
    pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    hub = EventHub(redis)
    yield redis, pool, JobClient(redis, pool, hub, 10)
    await pool.aclose()
    await redis.aclose()


def shift_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + by_s)
    monkeypatch.setattr(arq.utils, "time", lambda: real() + by_s)


async def claim(redis: Redis, queue: str) -> list[str]:
    """A worker's poll with a right clock (worker/process/arq_worker.py's arguments)."""
    claimed = await redis.register_script(CLAIM_JOBS)(
        keys=claim_keys(queue), args=[arq.utils.timestamp_ms(), 10, in_progress_key_prefix, 3000])
    return [claimed[i].decode() for i in range(0, len(claimed), 2)]


async def test_a_job_from_a_pod_ahead_is_due_at_once(
        pod: tuple[Redis, ArqRedis, JobClient], monkeypatch: pytest.MonkeyPatch) -> None:
    redis, _, client = pod
    model = f"skew-ahead-{time.monotonic_ns()}"
    job = TokenizeJob(model=model, content="hello")
    queue = keys.utility_queue(model)
    with monkeypatch.context() as patch:
        shift_clock(patch, HOUR_S)
        await client._enqueue(job, queue, None)
        waiting, waited_s = await waiting_jobs(redis, queue)  # /metrics, read by that pod
    assert waiting == 1 and 0 <= waited_s < 5
    assert await claim(redis, queue) == [job.job_id]


async def test_a_pod_behind_does_not_jump_the_queue(
        pod: tuple[Redis, ArqRedis, JobClient], monkeypatch: pytest.MonkeyPatch) -> None:
    redis, _, client = pod
    model = f"skew-behind-{time.monotonic_ns()}"
    queue = keys.utility_queue(model)
    first = TokenizeJob(model=model, content="first")
    await client._enqueue(first, queue, None)
    later = TokenizeJob(model=model, content="later")
    with monkeypatch.context() as patch:
        shift_clock(patch, -HOUR_S)
        await client._enqueue(later, queue, None)
    waiting, waited_s = await waiting_jobs(redis, queue)
    assert waiting == 2 and waited_s < 5  # not an hour
    assert await claim(redis, queue) == [first.job_id, later.job_id]


async def test_jobs_enqueued_in_the_same_millisecond_keep_arrival_order(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"skew-burst-{time.monotonic_ns()}"
    queue = keys.utility_queue(model)
    burst = [TokenizeJob(model=model, content=str(i)) for i in range(10)]
    for job in burst:  # a few per millisecond: job-id order would shuffle them
        await client._enqueue(job, queue, None)
    assert await claim(redis, queue) == [job.job_id for job in burst]

"""The utility and online embedding queues are bounded (issue 27, hole 3): with no worker
taking them, jobs past the bound get 503 with Retry-After at once and nothing of theirs stays
in Redis; the completion queue's bound (--queue-max) is untouched. Real Redis and the api's
JobClient."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from arq.connections import create_pool
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.contract.errors import Unavailable
from scheduler.contract.jobs import EmbeddingJob, TokenizeJob
from scheduler.hub import EventHub
from scheduler.queueing import deserialize_job, serialize_job

pytestmark = pytest.mark.process


@pytest_asyncio.fixture
async def client(redis_url: str) -> AsyncIterator[tuple[Redis, JobClient]]:
    redis = Redis.from_url(redis_url)
    pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    hub = EventHub(redis)
    await hub.start()
    jobs = JobClient(redis, pool, hub, 10)
    jobs.quick_queue_max = 2
    yield redis, jobs
    await hub.close()
    await pool.aclose()
    await redis.aclose()


async def test_a_full_utility_queue_refuses_at_once(client: tuple[Redis, JobClient]) -> None:
    redis, jobs = client
    model = f"quick-{time.monotonic_ns()}"
    async with contextlib.AsyncExitStack() as held:
        for i in range(2):
            await held.enter_async_context(jobs.submit(TokenizeJob(model=model, content=str(i))))
        late = TokenizeJob(model=model, content="late")
        with pytest.raises(Unavailable) as refused:
            await held.enter_async_context(jobs.submit(late))
        assert "queue is full" in refused.value.message
        assert await redis.zcard(keys.utility_queue(model)) == 2
        assert not await redis.exists(f"arq:job:{late.job_id}")


async def test_the_embedding_queue_has_its_own_bound(client: tuple[Redis, JobClient]) -> None:
    _, jobs = client
    model = f"quick-embed-{time.monotonic_ns()}"
    async with contextlib.AsyncExitStack() as held:
        await held.enter_async_context(jobs.submit(TokenizeJob(model=model, content="a")))
        await held.enter_async_context(jobs.submit(TokenizeJob(model=model, content="b")))
        for i in range(2):  # the utility queue's jobs do not count here
            await held.enter_async_context(
                jobs.submit(EmbeddingJob(model=model, inputs=[str(i)])))
        with pytest.raises(Unavailable):
            await held.enter_async_context(jobs.submit(EmbeddingJob(model=model, inputs=["c"])))

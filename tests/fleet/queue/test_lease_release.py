"""A job's lease goes with its last event, in the publisher's pipeline (no round trip of its
own), and only while this worker still holds it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.contract.results import FinalEvent, TokenizeResult
from scheduler.leases import Leases
from worker.wires.publisher import EventPublisher


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = open_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def publishing(redis: Redis) -> AsyncIterator[tuple[Leases, EventPublisher]]:
    leases = Leases(redis, "w1")
    publisher = EventPublisher(redis, leases=leases)
    task = asyncio.create_task(publisher.run())
    yield leases, publisher
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def finish(publisher: EventPublisher, job_id: str) -> None:
    done = publisher.expect(job_id)
    publisher.publish([(job_id, FinalEvent(result=TokenizeResult(tokens=[1])))])
    await asyncio.wait_for(done, 10)


async def test_the_lease_goes_with_the_final_event(
        redis: Redis, publishing: tuple[Leases, EventPublisher]) -> None:
    leases, publisher = publishing
    job_id = uuid.uuid4().hex
    await leases.start(job_id)
    assert await redis.get(keys.job_owner(job_id)) == b"w1"
    await finish(publisher, job_id)
    assert await redis.xlen(keys.job_event_log(job_id)) == 1
    assert await redis.hget(keys.job_state(job_id), "seq") == b"1"  # type: ignore[misc]
    assert not await redis.exists(keys.job_owner(job_id))
    assert job_id not in leases.held and job_id not in leases.releasing
    assert await leases.renew() == []  # ended, not lost
    await leases.release(job_id)  # the job function's own release: nothing left to do


async def test_a_lease_another_worker_took_is_left_alone(
        redis: Redis, publishing: tuple[Leases, EventPublisher]) -> None:
    """This worker's lease lapsed and another worker took the job: its owner key stays."""
    leases, publisher = publishing
    job_id = uuid.uuid4().hex
    await leases.start(job_id)
    await redis.set(keys.job_owner(job_id), "w2", px=3000)
    await finish(publisher, job_id)
    assert await redis.get(keys.job_owner(job_id)) == b"w2"
    await leases.release(job_id)
    assert await redis.get(keys.job_owner(job_id)) == b"w2"

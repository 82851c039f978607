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
from scheduler.contract.errors import Unavailable
from scheduler.contract.results import FinalEvent, TokenEvent, TokenizeResult
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
    """This worker's lease lapsed and another worker took the job: its owner key stays, and
    this worker's last event is not written (the job is the other worker's now)."""
    leases, publisher = publishing
    job_id = uuid.uuid4().hex
    await leases.start(job_id)
    await redis.set(keys.job_owner(job_id), "w2", px=3000)
    with pytest.raises(Unavailable, match="lease lost"):
        await finish(publisher, job_id)
    assert await redis.get(keys.job_owner(job_id)) == b"w2"
    assert await redis.xlen(keys.job_event_log(job_id)) == 0
    await leases.release(job_id)
    assert await redis.get(keys.job_owner(job_id)) == b"w2"


@pytest.mark.parametrize("taken_by", ["w2", None])
async def test_a_starved_workers_late_tokens_are_not_written(
        redis: Redis, taken_by: str | None) -> None:
    """A worker starved past its lease writes on once it runs again: its tokens must not reach
    the job's log nor its channel (the continuing worker read the log and numbers its events
    from there: two writers of one seq sequence make a client skip or repeat a token), whether
    another worker took the lease or it only lapsed; the job is stopped here."""
    stopped: list[str] = []
    leases = Leases(redis, "w1")
    publisher = EventPublisher(redis, on_lost=stopped.append, leases=leases)
    task = asyncio.create_task(publisher.run())
    job_id = uuid.uuid4().hex
    try:
        await leases.start(job_id)
        done = publisher.expect(job_id)
        publisher.publish([(job_id, TokenEvent(content=" a", tokens=[5], n_decoded=1))])
        await wait_for_log(redis, job_id, 1)
        pubsub = redis.pubsub()
        await pubsub.subscribe(keys.job_events(job_id))
        if taken_by is None:
            await redis.delete(keys.job_owner(job_id))
        else:
            await redis.set(keys.job_owner(job_id), taken_by, px=3000)
        publisher.publish([(job_id, TokenEvent(content=" b", tokens=[6], n_decoded=2))])
        with pytest.raises(Unavailable, match="lease lost"):
            await asyncio.wait_for(done, 10)
        assert stopped == [job_id]
        assert await redis.xlen(keys.job_event_log(job_id)) == 1
        assert await redis.hget(keys.job_state(job_id), "seq") == b"1"  # type: ignore[misc]
        assert job_id not in leases.held
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        assert message is None
        await pubsub.aclose()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for_log(redis: Redis, job_id: str, count: int) -> None:
    for _ in range(200):
        if await redis.xlen(keys.job_event_log(job_id)) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the log of job {job_id} never held {count} events")


async def test_one_flush_writes_the_jobs_it_holds_and_refuses_the_others(
        redis: Redis, publishing: tuple[Leases, EventPublisher]) -> None:
    """The events of several jobs go out in one script (issue 44): each job's are written
    only while its lease is this worker's, whatever the others' leases."""
    leases, publisher = publishing
    kept, taken = uuid.uuid4().hex, uuid.uuid4().hex
    for job_id in (kept, taken):
        await leases.start(job_id)
    await redis.set(keys.job_owner(taken), "w2", px=3000)
    done = {job_id: publisher.expect(job_id) for job_id in (kept, taken)}
    publisher.publish([(job_id, event) for job_id in (kept, taken) for event in (
        TokenEvent(content=" a", tokens=[1]), FinalEvent(result=TokenizeResult(tokens=[1])))])
    await asyncio.wait_for(done[kept], 10)
    with pytest.raises(Unavailable, match="lease lost"):
        await asyncio.wait_for(done[taken], 10)
    assert await redis.xlen(keys.job_event_log(kept)) == 2
    assert await redis.hget(keys.job_state(kept), "seq") == b"2"  # type: ignore[misc]
    assert await redis.xlen(keys.job_event_log(taken)) == 0
    assert await redis.get(keys.job_owner(taken)) == b"w2"
    await leases.release(taken)

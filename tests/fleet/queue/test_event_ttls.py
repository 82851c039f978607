"""A job's event log and state get their expiry with the job's first events, its last, and
now and then between (worker/wires/publisher.py TTL_REFRESH_S), not with every event (issue
44: two of a token's ~6 Redis commands). Real Redis, the publisher with a worker's leases
(the fenced write) and without (the plain pipeline)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.contract.results import FinalEvent, StartedEvent, TokenEvent, TokenizeResult
from scheduler.leases import Leases
from scheduler.migration import read_continuation
from worker.wires import publisher as publisher_module
from worker.wires.publisher import EventPublisher


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = open_redis(redis_url)
    yield client
    await client.aclose()


async def expires(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_expire", {}).get("calls", 0))


async def run_job(redis: Redis, fenced: bool, tokens: int,
                  between: float = 0.0) -> tuple[str, list[int]]:
    """Publish started, `tokens` token events one flush each, then final; the log's TTL seen
    after each flush, and the EXPIREs Redis ran meanwhile."""
    leases = Leases(redis, "w1") if fenced else None
    publisher = EventPublisher(redis, leases=leases)
    task = asyncio.create_task(publisher.run())
    job_id = uuid.uuid4().hex
    if leases is not None:
        await leases.start(job_id)
    log_key = keys.job_event_log(job_id)
    done = publisher.expect(job_id)
    ttls = []
    try:
        publisher.publish([(job_id, StartedEvent())])
        for i in range(tokens):
            publisher.publish([(job_id, TokenEvent(content=f" t{i}", tokens=[i]))])
            async with asyncio.timeout(10):
                while await redis.xlen(log_key) < i + 2:
                    await asyncio.sleep(0.005)
            ttls.append(await redis.ttl(log_key))
            await asyncio.sleep(between)
        publisher.publish([(job_id, FinalEvent(result=TokenizeResult(tokens=[1])))])
        await asyncio.wait_for(done, 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return job_id, ttls


@pytest.mark.parametrize("fenced", [True, False])
async def test_a_jobs_ttls_are_set_once_not_per_event(redis: Redis, fenced: bool) -> None:
    before = await expires(redis)
    job_id, ttls = await run_job(redis, fenced, tokens=20)
    assert all(0 < ttl <= keys.EVENT_LOG_TTL_S for ttl in ttls)  # set from the first write
    # the first write and the last, for the log and the state each: not 2 per event; with a
    # lease, its start sets the state's and the first write the log's only (issue 44, sixth
    # pass: 2 * 2 + 1 before)
    assert await expires(redis) - before <= 2 * 2
    assert await redis.ttl(keys.job_event_log(job_id)) >= keys.EVENT_LOG_TTL_S - 2
    assert await redis.ttl(keys.job_state(job_id)) >= keys.JOB_STATE_TTL_S - 2
    assert await redis.xlen(keys.job_event_log(job_id)) == 22


async def test_a_long_jobs_ttls_are_set_again(redis: Redis,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that runs longer than TTL_REFRESH_S has its expiry set again while it runs."""
    monkeypatch.setattr(publisher_module, "TTL_REFRESH_S", 0.2)
    before = await expires(redis)
    await run_job(redis, True, tokens=6, between=0.1)
    refreshed = await expires(redis) - before - 2 * 2
    assert refreshed >= 2 * 2  # every ~2 tokens, for the log and the state


async def test_a_later_run_numbers_on_from_the_log_not_the_lagging_state(
        redis: Redis) -> None:
    """The job state is written with a flush only now and then (its first, the one whose
    output makes `sent` > 0, its last): a run that follows a dead one numbers its events on
    from the log's last entry, and learns when it last wrote from the log."""
    leases = Leases(redis, "w1")
    publisher = EventPublisher(redis, leases=leases)
    task = asyncio.create_task(publisher.run())
    job_id = uuid.uuid4().hex
    await leases.start(job_id)
    log_key = keys.job_event_log(job_id)
    try:
        publisher.publish([(job_id, StartedEvent())])
        for i in range(5):
            publisher.publish([(job_id, TokenEvent(content=f" t{i}", tokens=[i]))])
            async with asyncio.timeout(10):
                while await redis.xlen(log_key) < i + 2:
                    await asyncio.sleep(0.005)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    state = await redis.hgetall(keys.job_state(job_id))  # type: ignore[misc]
    assert int(state[b"sent"]) > 0  # what a dead run's decision needs
    assert int(state[b"seq"]) < 6  # it lags: not one HSET a token
    await redis.delete(keys.job_owner(job_id))  # w1 died
    start = await Leases(redis, "w2").start(job_id)
    assert start.next_seq == 6
    resumed = await read_continuation(redis, job_id, 1, start.last_event_ms)
    assert resumed is not None and resumed.next_seq == 6
    last_at = int((await redis.xrevrange(log_key, count=1))[0][1][b"a"])
    assert resumed.died_at_ms == last_at >= start.last_event_ms

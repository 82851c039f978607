"""The order in which workers take waiting jobs (issue 47, scheduler/queue_order.py): by
priority, lower first, then by arrival; a job queued by arq's own enqueue_job after the ordered
ones; a job that ended leaves the order. Real Redis, the real arq pool and the scripts the api
and the workers run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import arq.utils
import pytest
import pytest_asyncio
from arq.connections import ArqRedis, create_pool
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler import fair_share
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
    deadline = time.monotonic() + 1.0  # arq scores its own job by this process's clock,
    while ((count := (await waiting_jobs(redis, queue))[0]) < 7  # rounded to the ms: it is
           and time.monotonic() < deadline):  # due by Redis's TIME within a millisecond
        await asyncio.sleep(0.001)
    assert count == 7  # the queue itself is as it was
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


def tenant_job(model: str, tenant: str, weight: float = 1.0, n_predict: int = 100,
               priority: int | None = None) -> CompletionJob:
    return CompletionJob(model=model, prompt="x", n_predict=n_predict, tenant=tenant,
                         weight=weight, priority=priority)


async def test_a_tenant_behind_a_backlog_waits_for_none_of_it(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """Start-time fair queueing (scheduler/fair_share.py): a's ten jobs queued first, then b's
    two: b's are taken beside a's first two, not after all ten; a third tenant that comes
    later is taken next, not behind the backlog."""
    redis, _, client = pod
    model = f"fair-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    a = [tenant_job(model, "a") for _ in range(10)]
    b = [tenant_job(model, "b") for _ in range(2)]
    for job in [*a, *b]:
        await client._enqueue(job, queue, None)
    owner = {job.job_id: name for name, jobs in (("a", a), ("b", b)) for job in jobs}
    first = [owner[j] for j in await claim(redis, queue, 4)]
    assert sorted(first) == ["a", "a", "b", "b"], first
    assert [owner[j] for j in await claim(redis, queue, 2)] == ["a", "a"]
    c = tenant_job(model, "c")
    await client._enqueue(c, queue, None)
    assert await claim(redis, queue, 1) == [c.job_id]


async def test_a_heavier_weight_gets_a_larger_share(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"fair-weight-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    jobs = [tenant_job(model, "light") for _ in range(6)] + [
        tenant_job(model, "heavy", weight=2) for _ in range(6)]
    for job in jobs:
        await client._enqueue(job, queue, None)
    owner = {job.job_id: job.tenant for job in jobs}
    taken = [owner[j] for j in await claim(redis, queue, 6)]
    assert taken.count("heavy") == 4 and taken.count("light") == 2, taken


async def test_priority_comes_before_fairness_and_one_tenant_is_fifo(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"fair-fifo-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    alone = [tenant_job(model, "a", n_predict=n) for n in (500, 1, 300, 2, 7)]
    urgent = tenant_job(model, "b", priority=-1, n_predict=10_000)
    for job in [*alone, urgent]:
        await client._enqueue(job, queue, None)
    assert await claim(redis, queue, 10) == [urgent.job_id, *(j.job_id for j in alone)]


async def test_a_job_that_took_less_than_estimated_gives_its_tenant_the_rest(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    redis, _, client = pod
    model = f"fair-settle-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    big = tenant_job(model, "a", n_predict=1000)
    await client._enqueue(big, queue, None)
    assert await claim(redis, queue, 1) == [big.job_id]
    b = [tenant_job(model, "b") for _ in range(3)]
    for job in b:
        await client._enqueue(job, queue, None)
    await fair_share.settle(redis, big, 10)  # it stopped after 10 tokens
    again = tenant_job(model, "a")
    await client._enqueue(again, queue, None)
    assert await claim(redis, queue, 2) == [b[0].job_id, again.job_id]


async def test_a_waiting_job_behind_pages_of_running_ones_is_taken(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """The order set is read by pages of 200: 450 running jobs (held) ahead of a waiting one,
    and a page of entries whose jobs ended, do not hide it."""
    redis, _, client = pod
    model = f"order-pages-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    jobs = [CompletionJob(model=model, prompt="p", priority=2) for _ in range(651)]
    for job in jobs:
        await client._enqueue(job, queue, None)
    assert len(await claim(redis, queue, 450)) == 450
    await redis.zrem(queue, *(job.job_id for job in jobs[450:650]))  # ended
    assert await claim(redis, queue, 5) == [jobs[650].job_id]
    assert await redis.zcard(queue_order_of(queue, 2)) == 451


async def test_without_fair_share_tenants_are_first_come_first_served(
        pod: tuple[Redis, ArqRedis, JobClient]) -> None:
    """--no-fair-share (the baseline of bench/fairness.py): every job counts as one tenant's."""
    redis, _, client = pod
    client.fair_share = False
    model = f"fifo-{time.monotonic_ns()}"
    queue = keys.slot_queue(model)
    jobs = [tenant_job(model, "a") for _ in range(3)] + [tenant_job(model, "b")]
    for job in jobs:
        await client._enqueue(job, queue, None)
    assert await claim(redis, queue, 4) == [job.job_id for job in jobs]

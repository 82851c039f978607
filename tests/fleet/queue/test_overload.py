"""Overload (issue 44): a worker whose event loop is behind keeps its leases (a thread renews
them, worker/process/lease_keeper.py) and takes no more jobs while it lags
(worker/process/loop_health.py); one whose loop stopped turning for good lets them go. Real
Redis, real arq workers (WakeableWorker) with plain job functions; the loop is blocked with a
plain sleep on it, as a core's worth of streams or a starved box blocks it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.leases import Leases, lease_ms
from tests.fleet.queue.test_arq_seam import enqueue, make_worker, pool, running, until
from worker.process.lease_keeper import LeaseKeeper
from worker.process.loop_health import ADMIT_LAG_S, LoopHealth
from worker.runtime.settings import WorkerSettings

__all__ = ["pool"]  # the fixture


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = open_redis(redis_url)
    yield client
    await client.aclose()


async def test_a_worker_whose_loop_is_blocked_keeps_its_leases(redis_url: str,
                                                               redis: Redis) -> None:
    """The loop is blocked past the lease (3 s): the leases of the job it runs and of one it
    claimed and has not started are renewed all the same, and nothing is told lost. Renewed
    from the loop (before), both lapsed and another worker could take the jobs."""
    leases = Leases(redis, "w-busy")
    running_job, claimed_job = uuid.uuid4().hex, uuid.uuid4().hex
    for job_id in (running_job, claimed_job):
        await redis.set(in_progress_key_prefix + job_id, b"1", px=lease_ms())
    await leases.start(running_job)
    leases.claimed.update({running_job, claimed_job})
    lost: list[list[str]] = []
    async with LeaseKeeper(redis_url, LoopHealth()) as keeper:
        keeper.keep(leases, lost.append)
        time.sleep(keys.JOB_LEASE_S + 1.5)  # the loop blocked, as starved
        assert await redis.get(keys.job_owner(running_job)) == b"w-busy"
        for job_id in (running_job, claimed_job):
            assert await redis.pttl(in_progress_key_prefix + job_id) > 1000
        await asyncio.sleep(0.1)
        assert lost == []
        assert keeper.renewals >= 3


async def test_a_loop_stuck_for_good_lets_its_leases_lapse(redis_url: str,
                                                           redis: Redis) -> None:
    """A loop that has not turned for the keeper's `stuck_s` holds no job: its leases lapse
    (another worker then continues the job); once lapsed, a lease is never renewed again and
    its job is told lost on the loop."""
    leases = Leases(redis, "w-stuck")
    job_id = uuid.uuid4().hex
    await redis.set(in_progress_key_prefix + job_id, b"1", px=lease_ms())
    await leases.start(job_id)
    lost: list[list[str]] = []
    async with LeaseKeeper(redis_url, LoopHealth(), stuck_s=0.5) as keeper:
        keeper.keep(leases, lost.append)
        time.sleep(keys.JOB_LEASE_S + 1)
        assert not await redis.exists(keys.job_owner(job_id))
        assert not await redis.exists(in_progress_key_prefix + job_id)
        await until(lambda: lost == [[job_id]], timeout=5)
    assert job_id in leases.gone and job_id not in leases.held


async def test_a_lease_another_worker_took_is_told_lost_on_the_loop(redis_url: str,
                                                                    redis: Redis) -> None:
    leases = Leases(redis, "w1")
    job_id = uuid.uuid4().hex
    await leases.start(job_id)
    await redis.set(keys.job_owner(job_id), "w2", px=3000)
    lost: list[list[str]] = []
    async with LeaseKeeper(redis_url, LoopHealth(), every_s=0.1) as keeper:
        keeper.keep(leases, lost.append)
        await until(lambda: lost == [[job_id]], timeout=5)
    assert await redis.get(keys.job_owner(job_id)) == b"w2"  # not touched
    assert leases.forget_gone(job_id)


async def test_a_worker_whose_loop_lags_takes_no_more_jobs(pool: ArqRedis) -> None:
    """While the loop lags past ADMIT_LAG_S a worker that runs a job claims no other, however
    many slots it has; it takes them once the loop has caught up. A worker that runs none
    takes one (progress on a box starved by others)."""
    queue = f"overload:{uuid.uuid4().hex}"
    runs: list[tuple[str, int]] = []
    block = asyncio.Event()
    worker = make_worker(pool, queue, runs, block=block, max_jobs=8)
    health = LoopHealth()
    worker.admission = health.room
    health.observe(ADMIT_LAG_S * 5)
    for i in range(4):
        await enqueue(pool, f"job-{i}", queue)
    async with running(worker):
        await until(lambda: len(runs) == 1)
        for _ in range(3):  # polls and wakes that find the loop lagging take nothing
            worker.wake.set()
            await asyncio.sleep(0.2)
        assert len(runs) == 1
        assert health.refused >= 3
        while health.lag_s > ADMIT_LAG_S:  # the loop catches up: a few good ticks
            health.observe(0.0)
        worker.wake.set()
        await until(lambda: len(runs) == 4)
        block.set()


def test_the_lag_follows_a_late_tick_at_once_and_an_early_one_slowly() -> None:
    health = LoopHealth()
    assert health.room(5) is None
    health.observe(1.0)
    assert health.lag_s == 1.0 and health.room(5) == 0 and health.room(0) == 1
    health.observe(0.0)
    assert 0.5 < health.lag_s < 1.0  # one good tick does not let work in again
    for _ in range(20):
        health.observe(0.0)
    assert health.lag_s < ADMIT_LAG_S and health.room(5) is None


def test_a_workers_admission_by_lag_is_off_unless_asked() -> None:
    """--admit-lag-ms is 0 by default: a real engine's loop lags too on a box short of CPU,
    and the rule then started a worker's jobs one by one (test_exhausted_kv_pool_ends_requests
    _with_500 saw its 4 requests run in turn under load); 0 bounds nothing."""
    assert WorkerSettings.model_validate({}).admit_lag_ms == 0
    health = LoopHealth(0)
    health.observe(5.0)
    assert health.room(3) is None
    asked = LoopHealth(WorkerSettings.model_validate({"admit_lag_ms": 100}).admit_lag_ms / 1000)
    asked.observe(5.0)
    assert asked.room(3) == 0

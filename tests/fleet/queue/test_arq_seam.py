"""The arq internals llamaq's leases rely on (arq is pinned in pyproject): a real Redis and
WakeableWorker, with plain job functions instead of the engine."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from arq import Retry
from arq.connections import ArqRedis, create_pool
from arq.constants import in_progress_key_prefix
from arq.worker import func

from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.leases import waiting_jobs
from scheduler.queueing import deserialize_job, serialize_job
from worker.process.arq_worker import WakeableWorker


@pytest.fixture
async def pool(redis_url: str) -> AsyncIterator[ArqRedis]:
    pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    yield pool
    await pool.aclose()


def make_worker(pool: ArqRedis, queue: str, runs: list[tuple[str, int]],
                block: asyncio.Event | None = None, hand_back: bool = False,
                max_jobs: int = 1) -> WakeableWorker:
    async def job(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
        runs.append((ctx["job_id"], ctx["job_try"]))
        if hand_back and ctx["job_try"] == 1:
            raise Retry()
        if block is not None:
            await block.wait()

    return WakeableWorker([func(job, name="job")], queue_name=queue, redis_pool=pool,
                          max_jobs=max_jobs, job_timeout=3600, max_tries=100, keep_result=0,
                          poll_delay=0.1, handle_signals=False, job_serializer=serialize_job,
                          job_deserializer=deserialize_job, log_results=False)


@contextlib.asynccontextmanager
async def running(worker: WakeableWorker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.main())
    try:
        yield task
    finally:
        task.cancel()
        for job_task in worker.tasks.values():
            job_task.cancel()
        await asyncio.gather(task, *worker.tasks.values(), return_exceptions=True)


async def enqueue(pool: ArqRedis, job_id: str, queue: str) -> None:
    """arq's enqueue_job, then due by Redis's clock: arq scores a job by this machine's time
    rounded to the ms, up to 0.5 ms ahead of Redis's TIME, by which llamaq's polls and counts
    read the queue (llamaq's own enqueue scores by TIME)."""
    await pool.enqueue_job("job", {}, _job_id=job_id, _queue_name=queue)
    await asyncio.sleep(0.001)


async def until(check: Any, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def test_a_poll_sees_past_any_number_of_held_jobs(pool: ArqRedis) -> None:
    queue = f"seam:{uuid.uuid4().hex}"
    held = {f"held-{i}": 1 for i in range(300)}
    await pool.zadd(queue, held)
    for job_id in held:
        await pool.set(in_progress_key_prefix + job_id, b"1", ex=60)
    runs: list[tuple[str, int]] = []
    await enqueue(pool, "new", queue)
    assert await waiting_jobs(pool, queue) == (1, pytest.approx(0, abs=5))
    async with running(make_worker(pool, queue, runs)):
        await until(lambda: runs)
    assert runs == [("new", 1)]


async def test_a_lapsed_lease_lets_another_worker_run_the_job(pool: ArqRedis) -> None:
    """The first worker stops renewing (as a killed one does): within JOB_LEASE_S its job goes
    to the next worker, as try 2 of the same job id."""
    queue = f"seam:{uuid.uuid4().hex}"
    runs: list[tuple[str, int]] = []
    await enqueue(pool, "lapse", queue)
    first = make_worker(pool, queue, runs, block=asyncio.Event())
    async with running(first):
        await until(lambda: runs)
        assert await pool.pttl(in_progress_key_prefix + "lapse") <= keys.JOB_LEASE_S * 1000
        first.taking = False  # "dies": no more polls, no renewals
        second = make_worker(pool, queue, runs, block=asyncio.Event())
        async with running(second):
            await until(lambda: len(runs) == 2, timeout=keys.JOB_LEASE_S + 5)
    assert runs == [("lapse", 1), ("lapse", 2)]


async def test_a_handed_back_job_goes_to_the_front_of_the_queue(pool: ArqRedis) -> None:
    queue = f"seam:{uuid.uuid4().hex}"
    runs: list[tuple[str, int]] = []
    await enqueue(pool, "back", queue)
    async with running(make_worker(pool, queue, runs, hand_back=True)):
        await until(lambda: len(runs) == 2)
    assert runs == [("back", 1), ("back", 2)]


async def test_two_workers_polling_one_queue_never_start_one_job(pool: ArqRedis,
                                                                 redis_url: str) -> None:
    """A poll claims the jobs it returns in the same step (one round trip): a second poll,
    concurrent or right after the first started its jobs (before any ran), never gets them."""
    queue = f"seam:{uuid.uuid4().hex}"
    ids = [f"claim-{i}" for i in range(40)]
    for job_id in ids:
        await enqueue(pool, job_id, queue)
    other = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                              job_deserializer=deserialize_job)
    runs: list[tuple[str, int]] = []
    block = asyncio.Event()
    first, second, third = (make_worker(p, queue, runs, block=block, max_jobs=15)
                            for p in (pool, other, pool))
    try:
        await asyncio.gather(first._poll_iteration(), second._poll_iteration())
        await third._poll_iteration()  # the others' tasks exist, none has run yet
        workers = (first, second, third)
        assert sum(len(w.tasks) for w in workers) == 40
        assert sum(w.job_counter for w in workers) == 40
        await until(lambda: len(runs) == 40)
        await asyncio.sleep(0.2)
        assert sorted(runs) == sorted((job_id, 1) for job_id in ids)
        for job_id in ids:
            assert 0 < await pool.pttl(in_progress_key_prefix + job_id) \
                <= keys.JOB_LEASE_S * 1000
        block.set()
        tasks = [t for w in workers for t in w.tasks.values()]
        await asyncio.gather(*tasks)
        assert all(w.job_counter == 0 for w in workers)  # arq's bookkeeping, as start_jobs'
        assert await pool.zcard(queue) == 0
    finally:
        block.set()
        await other.aclose()


async def test_a_job_started_in_a_preempted_jobs_seat_leaves_the_bound_as_it_was(
        pool: ArqRedis) -> None:
    """A preemption's look claims the urgent job and starts it at once (`start_in_seat`,
    worker/process/preempt.py) while its victim still runs: one job past max_jobs for that
    while (`job_counter` counts it, arq's semaphore does not); once both end the worker
    takes max_jobs jobs again, no more. A worker that drains gives such a job back at once."""
    queue = f"seam:{uuid.uuid4().hex}"
    runs: list[tuple[str, int]] = []
    block = asyncio.Event()
    worker = make_worker(pool, queue, runs, block=block, max_jobs=1)
    await enqueue(pool, "victim", queue)
    await worker._poll_iteration()
    await enqueue(pool, "urgent", queue)
    await pool.set(in_progress_key_prefix + "urgent", b"1", px=int(keys.JOB_LEASE_S * 1000))
    score = int(await pool.zscore(queue, "urgent") or 0)
    await worker.start_in_seat("urgent", score)
    await until(lambda: len(runs) == 2)
    assert worker.job_counter == 2 and sorted(runs) == [("urgent", 1), ("victim", 1)]
    block.set()
    await asyncio.gather(*worker.tasks.values())
    assert worker.job_counter == 0
    block.clear()
    for job_id in ("next-1", "next-2"):
        await enqueue(pool, job_id, queue)
    await worker._poll_iteration()
    await worker._poll_iteration()
    await until(lambda: len(runs) == 3)
    await asyncio.sleep(0.2)
    assert runs[2:] == [("next-1", 1)] and worker.job_counter == 1, "past max_jobs after a seat"
    worker.taking = False
    await pool.set(in_progress_key_prefix + "next-2", b"1", px=int(keys.JOB_LEASE_S * 1000))
    await worker.start_in_seat("next-2", 0)
    assert not await pool.exists(in_progress_key_prefix + "next-2")
    assert len(runs) == 3
    block.set()
    await asyncio.gather(*worker.tasks.values())

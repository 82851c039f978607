"""What a preemption's look at a queue costs (issue 47, scheduler/queue_order.py CLAIM_URGENT and
CANDIDATES, worker/process/preempt.py): every full worker looks at each enqueue, and the
running jobs' order entries come before the waiting ones, so a look that spent commands per
entry cost Redis hundreds of commands per worker per enqueue at 200 running jobs (the fair
bench at 50 workers: 1.5-2.9x FIFO's commands per completion). A look reads the order by
pages: a few commands whatever runs. Real Redis (its own, for its command counts), the real
arq pool and the scripts the api and the workers run."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import arq.utils
import pytest
import pytest_asyncio
from arq.connections import create_pool
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.contract.jobs import CompletionJob
from scheduler.hub import EventHub
from scheduler.leases import CLAIM_JOBS
from scheduler.queue_order import CANDIDATES, CLAIM_URGENT, claim_keys, urgent_keys
from scheduler.queueing import deserialize_job, serialize_job
from tests.processes import start_redis

pytestmark = pytest.mark.process

RUNNING, WAITING = 240, 5


@pytest_asyncio.fixture
async def queue(tmp_path: Path) -> AsyncIterator[tuple[Redis, str, list[str]]]:
    """A queue of RUNNING claimed priority 0 jobs, then WAITING ones (their ids, in order)."""
    process, url = start_redis(tmp_path / "redis")
    redis = Redis.from_url(url)
    pool = await create_pool(arq_settings(url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    try:
        client = JobClient(redis, pool, EventHub(redis), 10)
        model = f"look-{time.monotonic_ns()}"
        name = keys.slot_queue(model)
        jobs = [CompletionJob(model=model, prompt=f"job {i}", priority=0)
                for i in range(RUNNING + WAITING)]
        for job in jobs:
            await client._enqueue(job, name, None)
        claimed = await redis.register_script(CLAIM_JOBS)(
            keys=claim_keys(name), args=[arq.utils.timestamp_ms(), RUNNING,
                                         in_progress_key_prefix, 60_000])
        assert len(claimed) == 2 * RUNNING
        yield redis, name, [job.job_id for job in jobs[RUNNING:]]
    finally:
        await pool.aclose()
        await redis.aclose()
        process.terminate()
        process.wait()


async def commands(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(stat["calls"]) for stat in stats.values())


async def test_a_look_past_running_jobs_costs_a_few_commands(
        queue: tuple[Redis, str, list[str]]) -> None:
    redis, name, waiting = queue
    look = claim_keys(name)
    before = await commands(redis)
    found = await redis.eval(CANDIDATES, len(look), *look,  # type: ignore[misc]
                             "0", in_progress_key_prefix, "16")
    spent = await commands(redis) - before
    assert [found[i].decode() for i in range(1, len(found), 5)] == waiting
    assert spent < 20, f"the fair look ran {spent} commands past {RUNNING} running jobs"

    urgent = urgent_keys("look", [name])
    before = await commands(redis)
    claimed = await redis.eval(CLAIM_URGENT, len(urgent), *urgent,  # type: ignore[misc]
                               "1", in_progress_key_prefix, "10000")
    spent = await commands(redis) - before
    assert [v.decode() for v in claimed[:2]] == [waiting[0], "0"]
    assert spent < 20, f"the priority look ran {spent} commands past {RUNNING} running jobs"

    again = await redis.eval(CLAIM_URGENT, len(urgent), *urgent,  # type: ignore[misc]
                             "1", in_progress_key_prefix, "10000")
    assert again[0].decode() == waiting[1], "a claimed job counted for a second worker"
    found = await redis.eval(CANDIDATES, len(look), *look,  # type: ignore[misc]
                             "0", in_progress_key_prefix, "2")
    assert [found[i].decode() for i in range(1, len(found), 5)] == waiting[2:4]


async def test_the_priority_look_claims_the_job_for_its_worker(
        queue: tuple[Redis, str, list[str]]) -> None:
    """The look that finds a more urgent job claims it as a poll would (its lease, the queue
    score arq's run needs): the worker that preempts starts it at once, in its victim's seat,
    instead of reserving it and waiting for the victim's hand back and a poll."""
    redis, name, waiting = queue
    urgent = urgent_keys("look", [name])
    claimed = await redis.eval(CLAIM_URGENT, len(urgent), *urgent,  # type: ignore[misc]
                               "1", in_progress_key_prefix, "10000")
    job_id, priority, score, queue_number = (v.decode() for v in claimed)
    assert (job_id, priority, queue_number) == (waiting[0], "0", "1")
    assert int(float(score)) == int(await redis.zscore(name, job_id) or 0)
    assert 0 < await redis.pttl(in_progress_key_prefix + job_id) <= 10_000
    # a poll's claim no longer takes it: it is held
    polled = await redis.register_script(CLAIM_JOBS)(
        keys=claim_keys(name), args=[arq.utils.timestamp_ms(), 1, in_progress_key_prefix,
                                     60_000])
    assert polled[0].decode() == waiting[1]

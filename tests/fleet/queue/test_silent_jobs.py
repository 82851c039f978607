"""What a silent stream costs (issue 44): an api pod looks at all of its silent jobs in one
round trip (scheduler/silent_jobs.py), not five commands in three round trips a job twice a
second, and reads a job's log only when no run holds it; a dead worker's jobs are still
seen at once by its connections. Real Redis (its own, so that INFO commandstats counts only
this file's commands), the api's job client and event hub, a worker's real leases on a
connection named as a worker names its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio
from arq.connections import ArqRedis, create_pool
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings
from scheduler.contract import keys
from scheduler.contract.errors import RedisUnreachable, Unavailable
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.kinds import queue_for
from scheduler.contract.results import EventEnvelope, StartedEvent, TokenEvent
from scheduler.hub import EventHub, HubItem
from scheduler.job_events import JobEvents
from scheduler.leases import Leases
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.silent_jobs import Look
from scheduler.worker_presence import client_name
from tests.processes import start_redis

pytestmark = pytest.mark.process

STREAMS = 40
WINDOW_S = 2.0


@pytest.fixture(scope="module")
def own_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = start_redis(Path(tmp_path_factory.mktemp("redis-silent")))
    yield url
    process.terminate()
    process.wait()


@pytest_asyncio.fixture
async def pod(own_redis_url: str) -> AsyncIterator[tuple[Redis, JobClient]]:
    redis = Redis.from_url(own_redis_url)
    pool: ArqRedis = await create_pool(arq_settings(own_redis_url),
                                       job_serializer=serialize_job,
                                       job_deserializer=deserialize_job)
    hub = EventHub(redis)
    await hub.start()
    yield redis, JobClient(redis, pool, hub, 30)
    await hub.close()
    await pool.aclose()
    await redis.aclose()


async def calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def running_jobs(redis: Redis, leases: Leases, n: int) -> list[CompletionJob]:
    """Jobs a worker took: each holds its lease and logged its "started" event and one token
    (what the worker's publisher leaves behind; the pod reads them as it attaches)."""
    jobs = [CompletionJob(model="m", prompt="p") for _ in range(n)]
    for job in jobs:
        await leases.start(job.job_id)
        logged: list[StartedEvent | TokenEvent] = [
            StartedEvent(), TokenEvent(content=" a", tokens=[1], n_decoded=1)]
        for seq, event in enumerate(logged):
            envelope = EventEnvelope(job_id=job.job_id, seq=seq, event=event)
            await redis.xadd(keys.job_event_log(job.job_id),
                             {"e": envelope.model_dump_json()}, id=f"0-{seq + 1}")
        await redis.hset(keys.job_state(job.job_id), "sent", "1")  # type: ignore[misc]
    return jobs


async def silent_streams(stack: AsyncExitStack, client: JobClient,
                         jobs: list[CompletionJob]) -> list[asyncio.Task[object]]:
    """Each job's stream as the pod reads it, past its logged events: waiting, silent."""
    tasks: list[asyncio.Task[object]] = []
    for job in jobs:
        events: JobEvents = await stack.enter_async_context(client.attach(job))
        assert isinstance(await anext(events), StartedEvent)
        assert isinstance(await anext(events), TokenEvent)
        tasks.append(asyncio.create_task(anext(events)))
    return tasks


def worker_redis(url: str, worker_id: str) -> Redis:
    """A worker's connection, named as a worker names its own (its presence)."""
    return Redis.from_url(url, client_name=client_name(worker_id))


async def test_silent_streams_cost_one_round_trip_a_look_for_all(
        pod: tuple[Redis, JobClient], own_redis_url: str) -> None:
    redis, client = pod
    worker = worker_redis(own_redis_url, "w1")
    leases = Leases(worker, "w1")
    try:
        jobs = await running_jobs(redis, leases, STREAMS)
        async with AsyncExitStack() as stack:
            tasks = await silent_streams(stack, client, jobs)
            await leases.renew()  # held for 3 s from now: longer than the window
            before = await calls(redis)
            await asyncio.sleep(WINDOW_S)
            after = await calls(redis)
            assert not any(task.done() for task in tasks)
            for task in tasks:
                task.cancel()
        spent = {name: after[name] - before.get(name, 0) for name in after
                 if name not in ("info", "ping") and after[name] != before.get(name, 0)}
        job_seconds = STREAMS * WINDOW_S
        # each job looked at (0.5 s of silence, then the batch's tick): more than once a second
        assert spent.get("get", 0) >= job_seconds, spent
        assert sum(spent.values()) / job_seconds <= 5, spent  # before: ~10
        assert spent.get("evalsha", 0) <= WINDOW_S / 0.1 + 2, spent  # one for all, per tick
        # held runs: their logs are not read; one HMGET reads the state and the connection
        assert spent.get("xrange", 0) == spent.get("hget", 0) == 0, spent
        assert spent.get("exists", 0) == 0, spent
        assert spent.get("client|list", 0) <= WINDOW_S / 0.2 + 2, spent
    finally:
        await worker.aclose()


async def test_a_dead_workers_silent_jobs_end_before_their_leases_lapse(
        pod: tuple[Redis, JobClient], own_redis_url: str) -> None:
    """The worker's process ends (its named connection closes): its streams that had sent
    tokens end with 503 about a second later (two looks 0.5 s apart), not after the 3 s
    lease; a live worker's silent streams wait on."""
    redis, client = pod
    dead, live = worker_redis(own_redis_url, "w-dead"), worker_redis(own_redis_url, "w-live")
    try:
        dead_leases = Leases(dead, "w-dead")
        dead_jobs = await running_jobs(redis, dead_leases, 10)
        live_leases = Leases(live, "w-live")
        live_jobs = await running_jobs(redis, live_leases, 10)
        async with AsyncExitStack() as stack:
            dead_tasks = await silent_streams(stack, client, dead_jobs)
            live_tasks = await silent_streams(stack, client, live_jobs)
            await live_leases.renew()
            await dead_leases.renew()  # lapsing 3 s from now
            await dead.aclose()  # its sockets close, as a killed process's do
            died = time.monotonic()
            done, _ = await asyncio.wait(dead_tasks, timeout=2.2)
            took = time.monotonic() - died
            assert len(done) == len(dead_tasks), took
            for task in done:
                assert isinstance(task.exception(), Unavailable), task.exception()
            assert not any(task.done() for task in live_tasks)
            for task in live_tasks:
                task.cancel()
    finally:
        await live.aclose()


async def test_an_error_from_the_hub_waits_for_the_look_under_way(
        pod: tuple[Redis, JobClient]) -> None:
    """The hub gives up on Redis (a pod frozen past its grace) while a silent job's look is
    on its way: the look comes first and says to read the log even while the run still holds
    the job (its worker logged the end and has not let the lease go yet: the test of a pod
    thawed then, test_faults_gaps, failed so under load); the error stays in the queue."""
    redis, client = pod
    job = CompletionJob(model="m", prompt="p")
    envelope = EventEnvelope(job_id=job.job_id, seq=0, event=StartedEvent())
    await redis.xadd(keys.job_event_log(job.job_id), {"e": envelope.model_dump_json()},
                     id="0-1")
    await redis.hset(keys.job_state(job.job_id), "tries", "1")  # type: ignore[misc]
    await redis.set(keys.job_owner(job.job_id), "w1", px=3000)
    queue: asyncio.Queue[HubItem] = asyncio.Queue()
    queue.put_nowait(RedisUnreachable("lost the connection to the job queue (Redis)"))
    looked = await client.silent.look(job.job_id, 0, None, queue)
    assert isinstance(looked, Look) and looked.logged and looked.held
    assert isinstance(queue.get_nowait(), RedisUnreachable)
    # a look without an error: a held run's log is not read
    looked = await asyncio.wait_for(client.silent.look(job.job_id, 0, None, asyncio.Queue()), 5)
    assert isinstance(looked, Look) and looked.held and not looked.logged


async def test_queued_jobs_wake_one_more_waiting_worker_a_second_for_all(
        pod: tuple[Redis, JobClient]) -> None:
    """Jobs that wait unclaimed in a queue while a worker waits for jobs (its wake may have
    gone to a frozen worker: docs/faults.md) wake one more waiting worker about once a second,
    one script a tick for all of the pod's jobs (scheduler/wake.py Rewakes), not one script
    each a second (issue 44: ~9 % of the api during a 2,000-stream ramp)."""
    redis, client = pod
    model = f"rewake-{time.monotonic_ns()}"
    jobs = [CompletionJob(model=model, prompt="p", priority=2) for _ in range(STREAMS)]
    queue = queue_for(jobs[0])
    waiters = keys.queue_waiters(queue)
    wakes: list[float] = []
    listener = redis.pubsub()
    await listener.subscribe("wake:test")

    async def waiting_worker() -> None:
        """Waits among the waiters; back among them after each wake (its poll found the
        queue's jobs gone to another worker, as a frozen one's would be)."""
        await redis.zadd(waiters, {"wake:test": 1.0})
        async for message in listener.listen():
            if message["type"] == "message":
                wakes.append(time.monotonic())
                await redis.zadd(waiters, {"wake:test": 1.0})

    worker = asyncio.create_task(waiting_worker())
    try:
        for job in jobs:
            await client._enqueue(job, queue, None)
        async with AsyncExitStack() as stack:
            tasks = []
            for job in jobs:
                events: JobEvents = await stack.enter_async_context(client.attach(job))
                tasks.append(asyncio.create_task(anext(events)))
            await asyncio.sleep(1.5)  # a job is first rewoken after a second unclaimed
            woken = len(wakes)
            before = await calls(redis)
            await asyncio.sleep(WINDOW_S)
            after = await calls(redis)
            assert not any(task.done() for task in tasks)
            for task in tasks:
                task.cancel()
        spent = {name: after[name] - before.get(name, 0) for name in after
                 if name not in ("info", "ping") and after[name] != before.get(name, 0)}
        assert 1 <= len(wakes) - woken <= WINDOW_S + 1, (wakes, spent)  # about once a second
        # the waiters are looked at once a tick for the queue, not once a job a second
        assert spent.get("zcard", 0) <= WINDOW_S + 1, spent  # before: STREAMS a second
        assert spent.get("eval", 0) == 0, spent  # before: STREAMS a second
        assert spent.get("evalsha", 0) <= WINDOW_S / 0.1 + WINDOW_S + 3, spent  # looks + wakes
    finally:
        worker.cancel()
        await listener.aclose()
        await redis.delete(waiters)

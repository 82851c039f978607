"""What a flush of job events costs Redis (issue 44): the leases of all its jobs in one MGET,
and the announcements of all the jobs one api pod queued in one PUBLISH on that pod's channel
(CompletionJob.reply_to), which the pod's hub hands to each job; a job that another pod
attached to (a resumed stream) is announced on its own channel too. Real Redis (its own, so
that INFO commandstats counts only this file's commands), the real publisher and hub."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from scheduler.connections import open_redis
from scheduler.contract import event_keys, keys
from scheduler.contract.errors import Unavailable
from scheduler.contract.results import EventEnvelope, FinalEvent, TokenEvent, TokenizeResult
from scheduler.hub import EventHub
from scheduler.leases import Leases
from tests.processes import start_redis
from worker.wires.publisher import EventPublisher

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def own_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = start_redis(Path(tmp_path_factory.mktemp("redis-events")))
    yield url
    process.terminate()
    process.wait()


@pytest.fixture
async def redis(own_redis_url: str) -> AsyncIterator[Redis]:
    client = open_redis(own_redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def hub(redis: Redis) -> AsyncIterator[EventHub]:
    events = EventHub(redis)
    await events.start()
    yield events
    await events.close()


async def calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


async def test_a_flush_announces_one_pods_jobs_in_one_message(redis: Redis,
                                                            hub: EventHub) -> None:
    leases = Leases(redis, "w1")
    publisher = EventPublisher(redis, leases=leases)
    task = asyncio.create_task(publisher.run())
    jobs = [uuid.uuid4().hex for _ in range(3)]
    try:
        async with (hub.subscription(jobs[0]) as q0, hub.subscription(jobs[1]) as q1,
                    hub.subscription(jobs[2]) as q2):
            for job_id in jobs:
                await leases.start(job_id)
            done = [publisher.expect(job_id, reply_to=hub.channel) for job_id in jobs]
            before = await calls(redis)
            publisher.publish([(job_id, TokenEvent(content=f" {n}", tokens=[n]))
                               for n, job_id in enumerate(jobs)])
            for n, queue in enumerate((q0, q1, q2)):
                item = await asyncio.wait_for(queue.get(), 10)
                assert isinstance(item, EventEnvelope)
                assert (item.job_id, item.seq) == (jobs[n], 0)
                assert isinstance(item.event, TokenEvent) and item.event.tokens == [n]
            after = await calls(redis)
            spent = {name: after[name] - before.get(name, 0) for name in after
                     if name != "info" and after[name] != before.get(name, 0)}
            # (a job's first flush sets its log's and state's expiry and writes its state)
            assert {name: spent.get(name, 0) for name in ("eval", "mget", "get", "xadd",
                                                          "publish")} == {
                "eval": 1, "mget": 1, "get": 0, "xadd": 3, "publish": 1}, spent
            publisher.publish([(job_id, FinalEvent(result=TokenizeResult(tokens=[1])))
                               for job_id in jobs])
            await asyncio.wait_for(asyncio.gather(*done), 10)
            for queue in (q0, q1, q2):
                item = await asyncio.wait_for(queue.get(), 10)
                assert isinstance(item, EventEnvelope) and item.event.kind == "final"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_watched_job_is_announced_on_its_own_channel_too(redis: Redis,
                                                                hub: EventHub) -> None:
    """Another pod attached to the job (scheduler/client.py attach): it hears the job on the
    job's own channel, and the queuing pod still on its own."""
    leases = Leases(redis, "w1")
    publisher = EventPublisher(redis, leases=leases)
    task = asyncio.create_task(publisher.run())
    job_id = uuid.uuid4().hex
    other = EventHub(redis)
    await other.start()
    try:
        async with hub.subscription(job_id) as mine, other.subscription(job_id) as theirs:
            await redis.set(event_keys.job_watched(job_id), "1", ex=60)
            await leases.start(job_id)
            done = publisher.expect(job_id, reply_to=hub.channel)
            publisher.publish([(job_id, TokenEvent(content=" a", tokens=[7])),
                               (job_id, FinalEvent(result=TokenizeResult(tokens=[1])))])
            await asyncio.wait_for(done, 10)
            for queue in (mine, theirs):
                got = [await asyncio.wait_for(queue.get(), 10) for _ in range(2)]
                assert [(e.seq, e.event.kind) for e in got  # type: ignore[union-attr]
                        ] == [(0, "token"), (1, "final")]
    finally:
        await other.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_junk_on_a_pods_channel_harms_no_job(redis: Redis, hub: EventHub) -> None:
    job_id = uuid.uuid4().hex
    async with hub.subscription(job_id) as queue:
        for junk in (b"B" + job_id.encode() + b" 99 E{", b"Bx", b"B" + job_id.encode() + b" 2 E{",
                     b"Z"):
            await redis.publish(hub.channel, junk)
        envelope = EventEnvelope(job_id=job_id, seq=0, event=TokenEvent(content=" a",
                                                                         tokens=[1]))
        data = b"E" + envelope.model_dump_json().encode()
        await redis.publish(hub.channel, b"B" + job_id.encode() + b" %d " % len(data) + data)
        item = await asyncio.wait_for(queue.get(), 10)
        assert item == envelope
        assert hub.reader.done() is False


async def test_a_last_flush_lets_its_jobs_leases_go_in_its_own_script(redis: Redis,
                                                                      hub: EventHub) -> None:
    """The leases of the jobs whose last event a flush carries go in the flush's script, which
    read their owners already (issue 44, sixth pass: a script of its own read each again, an
    EVAL and a GET a job), only those this worker holds."""
    leases = Leases(redis, "w1")
    publisher = EventPublisher(redis, leases=leases)
    task = asyncio.create_task(publisher.run())
    jobs = [uuid.uuid4().hex for _ in range(3)]
    try:
        for job_id in jobs:
            await leases.start(job_id)
        await redis.set(keys.job_owner(jobs[2]), "w2")  # another worker's now
        done = [publisher.expect(job_id, reply_to=hub.channel) for job_id in jobs]
        before = await calls(redis)
        publisher.publish([(job_id, FinalEvent(result=TokenizeResult(tokens=[1])))
                           for job_id in jobs])
        await asyncio.wait_for(asyncio.gather(*done[:2]), 10)
        with pytest.raises(Unavailable):
            await asyncio.wait_for(done[2], 10)
        after = await calls(redis)
        spent = {name: after[name] - before.get(name, 0) for name in after
                 if name != "info" and after[name] != before.get(name, 0)}
        assert {name: spent.get(name, 0) for name in ("eval", "mget", "get", "del")} == {
            "eval": 1, "mget": 1, "get": 0, "del": 2}, spent  # before: 2 EVALs, 3 GETs
        assert not await redis.exists(keys.job_owner(jobs[0]), keys.job_owner(jobs[1]))
        assert await redis.get(keys.job_owner(jobs[2])) == b"w2"
        assert not leases.held and not leases.releasing
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

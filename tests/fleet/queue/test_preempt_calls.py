"""The preemptors' two scripts (issue 47, scheduler/preempt_call.py) on a real Redis, with the
api's enqueue script (JobClient._enqueue) and real pub/sub subscribers standing for the
workers' preemption channels: a queued job calls the one full worker of the largest score
above its priority (and pops it), drops a channel nobody hears, and calls nobody, waking the
queue's full workers on its shared channel instead, when no score is above its priority; a
worker that joins while a more urgent job waits is told to look."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from arq.connections import create_pool
from arq.constants import in_progress_key_prefix
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings
from scheduler.contract import keys, preempt_keys
from scheduler.contract.jobs import CompletionJob
from scheduler.hub import EventHub
from scheduler.preempt_call import ADVERTISE
from scheduler.queue_order import claim_keys
from scheduler.queueing import deserialize_job, serialize_job

pytestmark = pytest.mark.process


@pytest_asyncio.fixture
async def pod(redis_url: str) -> AsyncIterator[tuple[Redis, JobClient, str]]:
    redis = Redis.from_url(redis_url)
    pool = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                             job_deserializer=deserialize_job)
    yield redis, JobClient(redis, pool, EventHub(redis), 10), f"calls-{time.monotonic_ns()}"
    await pool.aclose()
    await redis.aclose()


class Ears:
    """Subscribers on some channels, recording what each hears."""

    def __init__(self, redis: Redis, channels: list[str]) -> None:
        self.heard: list[tuple[str, str]] = []
        self._pubsub: Any = redis.pubsub(ignore_subscribe_messages=True)
        self._channels = channels
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Ears:
        await self._pubsub.subscribe(*self._channels)
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for message in self._pubsub.listen():
            if message["type"] == "message":
                self.heard.append((message["channel"].decode(), message["data"].decode()))

    async def settle(self) -> list[tuple[str, str]]:
        await asyncio.sleep(0.2)
        return list(self.heard)

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await self._pubsub.aclose()


async def test_a_queued_job_calls_the_one_full_worker_that_may_preempt_for_it(
        pod: tuple[Redis, JobClient, str]) -> None:
    redis, client, model = pod
    queue = keys.slot_queue(model)
    preemptors = preempt_keys.queue_preemptors(queue)
    channel = {name: preempt_keys.worker_preempt_channel(queue, name)
               for name in ("w5", "w10", "gone")}
    await redis.zadd(preemptors, {channel["w5"]: 5, channel["w10"]: 10,
                                  channel["gone"]: float("inf")})
    shared = keys.wake_channel(queue)
    async with Ears(redis, [channel["w5"], channel["w10"], shared]) as ears:
        await client._enqueue(CompletionJob(model=model, prompt="a", priority=0), queue, None)
        # the largest score (a channel nobody hears, dropped) then the next: w10, popped
        assert await ears.settle() == [(channel["w10"], "0")]
        assert await redis.zrange(preemptors, 0, -1) == [channel["w5"].encode()]
        await client._enqueue(CompletionJob(model=model, prompt="b", priority=5), queue, None)
        # nobody's score is above 5: the shared wake, as before
        assert await ears.settle() == [(channel["w10"], "0"), (shared, "1")]
        assert await redis.zrange(preemptors, 0, -1) == [channel["w5"].encode()]
        # a job in another queue (a worker's own) calls nobody
        own = keys.worker_queue(model, "w5")
        await client._enqueue(CompletionJob(model=model, prompt="c", priority=0), own, None)
        assert await redis.zrange(preemptors, 0, -1) == [channel["w5"].encode()]


async def test_a_worker_that_joins_while_a_more_urgent_job_waits_is_told_to_look(
        pod: tuple[Redis, JobClient, str]) -> None:
    redis, client, model = pod
    queue = keys.slot_queue(model)
    own = keys.worker_queue(model, "w")
    join = redis.register_script(ADVERTISE)
    args = [preempt_keys.queue_preemptors(queue), *claim_keys(queue), *claim_keys(own)]
    channel = preempt_keys.worker_preempt_channel(queue, "w")

    async def joined(score: str) -> int:
        return int(await join(keys=args, args=[channel, score, in_progress_key_prefix, 60_000]))

    assert await joined("10") == 0, "nothing waits"
    assert await redis.zscore(args[0], channel) == 10
    urgent = CompletionJob(model=model, prompt="urgent", priority=3)
    await client._enqueue(urgent, own, None)  # in its own queue: a join sees it too
    assert await joined("3") == 0, "a job of the victim's own priority is not more urgent"
    assert await joined("+inf") == 1, "a batch line gives way to any online job"
    assert await joined("10") == 1
    await redis.set(in_progress_key_prefix + urgent.job_id, "1")  # a worker holds it
    assert await joined("10") == 0
    assert await joined("") == 0
    assert await redis.exists(args[0]) == 0, "the last worker left"

"""A job that is silent until its result (an embedding, a rerank) ends while the api checks on
its worker: the worker logs the final event, counts it as sent and lets the lease go after
the api's look (scheduler/silent_jobs.py) found its log empty. The api must read that result,
not call the worker dead (real Redis, the api's own JobEvents)."""

from __future__ import annotations

import asyncio

from scheduler.connections import open_redis
from scheduler.contract import keys
from scheduler.contract.jobs import EmbeddingJob
from scheduler.contract.results import (
    EmbeddingItem,
    EmbeddingResult,
    EventEnvelope,
    FinalEvent,
    pack_floats,
)
from scheduler.hub import EventHub, HubItem
from scheduler.job_events import JobEvents
from scheduler.silent_jobs import Look


async def test_a_result_logged_as_the_lease_ends_is_read_not_a_dead_worker(
        redis_url: str) -> None:
    redis = open_redis(redis_url)
    hub = EventHub(redis)
    await hub.start()
    try:
        job = EmbeddingJob(model="m", inputs=["x"])
        queue: asyncio.Queue[HubItem] = asyncio.Queue()
        events = JobEvents(job, queue, 30, redis, hub)
        result = EmbeddingResult(pooling="mean", items=[
            EmbeddingItem(index=0, n_tokens=3, n_embd=2, data=pack_floats([0.6, 0.8]))])
        envelope = EventEnvelope(job_id=job.job_id, seq=0, event=FinalEvent(result=result))
        # what the worker's last pipeline and its release leave behind (no owner key: the
        # lease was let go; the pub/sub announcement has not reached this pod yet)
        await redis.xadd(keys.job_event_log(job.job_id), {"e": envelope.model_dump_json()},
                         id="0-1")
        await redis.hset(keys.job_state(job.job_id),  # type: ignore[misc]
                         mapping={"tries": "1", "sent": "1", "seq": "1"})
        # the check that follows a look which found the log empty and the lease gone
        await events._check_worker(Look(held=False, tries=1, sent=1, handed=False,
                                        pinned_alive=True, logged=False))
        assert await asyncio.wait_for(events.result(), 10) == result
    finally:
        await hub.close()
        await redis.aclose()

"""The api process's connections to the fleet: Redis, the arq queue, the event hub."""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from arq.connections import ArqRedis, create_pool
from redis.asyncio import Redis

from scheduler import limits
from scheduler.client import AnyJob, JobClient, JobEvents
from scheduler.hub import EventHub
from scheduler.jobs import CompletionJob
from scheduler.queueing import deserialize_job, redis_settings, serialize_job
from scheduler.registry import Registry, WorkerInfo

WORKERS_CACHE_S = 0.5


class CheckedJobClient(JobClient):
    """A job client that checks every completion against the limits before it exists on
    Redis (whatever route made it), and caps n_probs."""

    def __init__(self, redis: Redis, arq: ArqRedis, hub: EventHub, timeout_s: float,
                 n_probs_max: int) -> None:
        super().__init__(redis, arq, hub, timeout_s)
        self.n_probs_max = n_probs_max

    def submit(self, job: AnyJob) -> AbstractAsyncContextManager[JobEvents]:  # type: ignore[override]
        if isinstance(job, CompletionJob):
            limits.check_completion(job, self.n_probs_max)
        return super().submit(job)


@dataclass
class Fleet:
    redis: Redis
    arq: ArqRedis
    hub: EventHub
    jobs: JobClient
    registry: Registry
    _workers: dict[str, tuple[float, list[WorkerInfo]]] = field(default_factory=dict)

    @classmethod
    async def connect(cls, redis_url: str, timeout_s: float,
                      n_probs_max: int = limits.DEFAULT_N_PROBS_MAX) -> Fleet:
        redis = Redis.from_url(redis_url)
        arq = await create_pool(redis_settings(redis_url), job_serializer=serialize_job,
                                job_deserializer=deserialize_job)
        hub = EventHub(redis)
        await hub.start()
        jobs = CheckedJobClient(redis, arq, hub, timeout_s, n_probs_max)
        return cls(redis, arq, hub, jobs, Registry(redis))

    async def workers(self, model_id: str, fresh: bool = False) -> list[WorkerInfo]:
        """The model's live workers in registry order (cached for a moment: it is read for
        every response that shows a slot id)."""
        cached = self._workers.get(model_id)
        if not fresh and cached is not None and time.monotonic() - cached[0] < WORKERS_CACHE_S:
            return cached[1]
        workers = await self.registry.live_workers(model_id)
        self._workers[model_id] = (time.monotonic(), workers)
        return workers

    async def close(self) -> None:
        await self.hub.close()
        await self.arq.aclose()
        await self.redis.aclose()

"""The api process's connections to the fleet: Redis, the arq queue, the event hub."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from arq.connections import ArqRedis, create_pool
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.connections import arq_settings, open_redis
from scheduler.hub import EventHub
from scheduler.queueing import deserialize_job, serialize_job
from scheduler.registry import Registry, WorkerInfo

WORKERS_CACHE_S = 0.5


@dataclass
class Fleet:
    redis: Redis
    arq: ArqRedis
    hub: EventHub
    jobs: JobClient
    registry: Registry
    _workers: dict[str, tuple[float, list[WorkerInfo]]] = field(default_factory=dict)

    @classmethod
    async def connect(cls, redis_url: str, timeout_s: float) -> Fleet:
        redis = open_redis(redis_url)
        arq = await create_pool(arq_settings(redis_url), job_serializer=serialize_job,
                                job_deserializer=deserialize_job)
        hub = EventHub(redis)
        await hub.start()
        return cls(redis, arq, hub, JobClient(redis, arq, hub, timeout_s), Registry(redis))

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

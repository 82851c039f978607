"""The api process's connections to the fleet: Redis, the arq queue, the event hub."""

from __future__ import annotations

from dataclasses import dataclass

from arq.connections import ArqRedis, create_pool
from redis.asyncio import Redis

from scheduler.client import JobClient
from scheduler.hub import EventHub
from scheduler.queueing import deserialize_job, redis_settings, serialize_job
from scheduler.registry import Registry


@dataclass
class Fleet:
    redis: Redis
    arq: ArqRedis
    hub: EventHub
    jobs: JobClient
    registry: Registry

    @classmethod
    async def connect(cls, redis_url: str, timeout_s: float) -> Fleet:
        redis = Redis.from_url(redis_url)
        arq = await create_pool(redis_settings(redis_url), job_serializer=serialize_job,
                                job_deserializer=deserialize_job)
        hub = EventHub(redis)
        await hub.start()
        return cls(redis, arq, hub, JobClient(redis, arq, hub, timeout_s), Registry(redis))

    async def close(self) -> None:
        await self.hub.close()
        await self.arq.aclose()
        await self.redis.aclose()
